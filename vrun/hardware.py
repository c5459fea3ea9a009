"""GPU parts and their memory: `cluster.gpu` names one, `cluster.gpu_mem_gib` (when set) overrides its memory.

Memory is the vendor's HBM figure for the part (GB as sold, taken as GiB: the device reports slightly less
or more; set cluster.gpu_mem_gib for the exact figure of a part or a MIG slice).
"""
from __future__ import annotations

from typing import Optional

from vrun.problems import Problem

GPU_MEM_GIB = {
    "A100": 80.0, "H100": 80.0, "H800": 80.0, "H20": 96.0, "GH200": 96.0, "H200": 141.0, "B200": 180.0,
    "GB200": 186.0, "B300": 288.0, "GB300": 288.0, "MI250X": 128.0, "MI300X": 192.0, "MI325X": 256.0,
    "MI355X": 288.0,
}


def gpu_mem_gib(cluster: dict) -> tuple[Optional[float], list[Problem]]:
    """The per-GPU memory the estimate uses, or None with the problem."""
    override = cluster.get("gpu_mem_gib")
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, (int, float)) or not 0 < override <= 2 ** 20:
            return None, [Problem("cluster.gpu_mem_gib", override, "must be a positive, finite number of GiB",
                                  "cluster.gpu_mem_gib=80")]
        return float(override), []
    gpu = str(cluster.get("gpu") or "")
    for name, mem in GPU_MEM_GIB.items():
        if name.lower() == gpu.lower():
            return mem, []
    return None, [Problem("cluster.gpu", gpu, "not a GPU part this project knows the memory of",
                          f"cluster.gpu in {list(GPU_MEM_GIB)}, or set cluster.gpu_mem_gib")]
