"""GPU parts: memory, peak compute and bandwidths in one table. `cluster.gpu` names a part, `cluster.gpu_mem_gib`
(when set) overrides its memory.

Memory is the vendor's HBM figure for the part (GB as sold, taken as GiB: the device reports slightly less
or more; set cluster.gpu_mem_gib for the exact figure of a part or a MIG slice). Compute is dense (no 2:4
sparsity) tensor-core FLOP/s; bandwidths are per direction in bytes/s:
  nvlink   per GPU, GPU to GPU within a node (the vendor's bidirectional figure halved)
  network  per node, the vendor's reference system (DGX/HGX or the OAM platform): scale-out NICs × link rate
  pcie     per GPU, host to device (the PCIe generation's x16 rate)
Two facts of the system the part is built into, apart from the mesh's own mesh.gpus_per_node: its GPUs per node (a
server or compute tray) and its NVLink domain (the GPUs one NVLink fabric joins: a node's 8 on DGX/HGX, 72 across
18 compute trays of 4 on a GB200/GB300 NVL72 rack). Collectives inside the domain run at NVLink speed
(vrun/estimate/steptime.py nvlink_span), across domains over the node's network.
Each part names where its figures come from. The step-time estimate (vrun/estimate/steptime.py) reads these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vrun.core.problems import Problem

TB, GB = 1e12, 1e9


@dataclass(frozen=True)
class Part:
    mem_gib: float
    bf16_flops: float           # dense
    fp8_flops: Optional[float]  # dense; None where the part has no fp8 tensor cores
    hbm: float                  # bytes/s
    nvlink: float               # bytes/s per GPU per direction
    network: float              # bytes/s per node per direction
    pcie: float                 # bytes/s per GPU per direction
    source: str
    gpus_per_node: int = 8      # GPUs in one node (server or compute tray) of the system as built
    nvlink_domain: int = 8      # GPUs one NVLink fabric joins
    system: str = "8 GPUs per node, one NVLink domain per node (the vendor's 8-GPU DGX/HGX or OAM platform)"


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989 TFLOPS bf16, 1,979 fp8 dense = half the sparse figures; " \
    "3.35 TB/s; NVLink 900 GB/s; PCIe Gen5 128 GB/s bidirectional); DGX H100: 8× 400 Gb/s ConnectX-7"
_H200 = "NVIDIA H200 datasheet (SXM: 989/1,979 TFLOPS dense, 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5); " \
    "HGX H200: 8× 400 Gb/s"
_B200 = "NVIDIA DGX B200 datasheet (72 PFLOPS fp8 training per 8 GPUs = 4.5 PF dense fp8, 2.25 PF bf16; " \
    "HBM3e 8 TB/s; NVLink 5 1.8 TB/s; 8× 400 Gb/s ConnectX-7)"
_GB200 = "NVIDIA GB200 NVL72 datasheet (per GPU 2.5 PF bf16 / 5 PF fp8 dense, 8 TB/s, NVLink 5 1.8 TB/s; " \
    "ConnectX-8 800 Gb/s per GPU, counted as 4 GPUs per node)"
_NVL72 = "NVIDIA GB200 NVL72 / GB300 NVL72 product pages: one rack of 18 compute trays, each 2 Grace-Blackwell " \
    "superchips = 4 GPUs, 72 GPUs in one NVLink domain (130 TB/s NVLink Switch fabric)"
PARTS = {
    "A100": Part(80.0, 312 * TB, None, 2.039 * TB, 300 * GB, 200 * GB, 32 * GB,
                 "NVIDIA A100 datasheet (SXM 80GB: 312 TFLOPS bf16 dense, 2,039 GB/s, NVLink 600 GB/s, PCIe "
                 "Gen4 64 GB/s bidirectional); DGX A100: 8× 200 Gb/s HDR"),
    "H100": Part(80.0, 989 * TB, 1979 * TB, 3.35 * TB, 450 * GB, 400 * GB, 64 * GB, _H100),
    "H800": Part(80.0, 989 * TB, 1979 * TB, 3.35 * TB, 200 * GB, 400 * GB, 64 * GB,
                 "NVIDIA H800 SXM5 (H100 compute and HBM; NVLink 400 GB/s bidirectional)"),
    "H20": Part(96.0, 148 * TB, 296 * TB, 4.0 * TB, 450 * GB, 400 * GB, 64 * GB,
                "NVIDIA H20 product brief (148 TFLOPS bf16, 296 fp8 dense, 4.0 TB/s, NVLink 900 GB/s)"),
    "GH200": Part(96.0, 989 * TB, 1979 * TB, 4.0 * TB, 450 * GB, 400 * GB, 450 * GB,
                  "NVIDIA GH200 datasheet (H100 compute, 96 GB HBM3 4 TB/s, NVLink-C2C 900 GB/s to the CPU)",
                  1, 1, "NVIDIA GH200 datasheet: one Grace Hopper superchip per MGX node, its NVLink-C2C joining GPU "
                  "and CPU (no GPU-to-GPU NVLink domain beyond it; the mesh's node is taken as given)"),
    "H200": Part(141.0, 989 * TB, 1979 * TB, 4.8 * TB, 450 * GB, 400 * GB, 64 * GB, _H200),
    "B200": Part(180.0, 2250 * TB, 4500 * TB, 8.0 * TB, 900 * GB, 400 * GB, 64 * GB, _B200),
    "GB200": Part(186.0, 2500 * TB, 5000 * TB, 8.0 * TB, 900 * GB, 400 * GB, 450 * GB, _GB200, 4, 72, _NVL72),
    "B300": Part(288.0, 2250 * TB, 4500 * TB, 8.0 * TB, 900 * GB, 800 * GB, 64 * GB,
                 "NVIDIA DGX B300 datasheet (72 PFLOPS fp8 training per 8 GPUs, HBM3e 8 TB/s, NVLink 1.8 TB/s, "
                 "8× 800 Gb/s ConnectX-8)"),
    "GB300": Part(288.0, 2500 * TB, 5000 * TB, 8.0 * TB, 900 * GB, 400 * GB, 450 * GB,
                  "NVIDIA GB300 NVL72 datasheet (GB200 dense bf16/fp8, 8 TB/s, NVLink 1.8 TB/s, 800 Gb/s per GPU)",
                  4, 72, _NVL72),
    "MI250X": Part(128.0, 383 * TB, None, 3.2 * TB, 200 * GB, 200 * GB, 32 * GB,
                   "AMD Instinct MI250X datasheet (383 TFLOPS bf16, 3.2 TB/s, 8 Infinity Fabric links)"),
    "MI300X": Part(192.0, 1307 * TB, 2615 * TB, 5.3 * TB, 448 * GB, 400 * GB, 64 * GB,
                   "AMD Instinct MI300X datasheet (1,307.4 TFLOPS bf16, 2,614.9 fp8 dense, 5.3 TB/s, "
                   "Infinity Fabric 896 GB/s, PCIe Gen5)"),
    "MI325X": Part(256.0, 1307 * TB, 2615 * TB, 6.0 * TB, 448 * GB, 400 * GB, 64 * GB,
                   "AMD Instinct MI325X datasheet (MI300X compute, 256 GB HBM3E 6 TB/s)"),
    "MI355X": Part(288.0, 2500 * TB, 5000 * TB, 8.0 * TB, 576 * GB, 400 * GB, 64 * GB,
                   "AMD Instinct MI355X datasheet (2.5 PF fp16/bf16, 5 PF fp8 dense, 8 TB/s HBM3E)"),
}
GPU_MEM_GIB = {name: p.mem_gib for name, p in PARTS.items()}

# NCCL's own latency model of a collective, in microseconds (src/graph/tuning.cc of NVIDIA/nccl at commit
# b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2: baseLat and hwLat for the LL protocol, the lowest-latency one; NCCL
# picks the algorithm and protocol with the least modelled time per call). Software and fabric facts of the
# library, not of any measured run; the same for every GPU part NCCL runs on.
NCCL_LATENCY_US = {
    "base_ring_ll": 6.6, "base_tree_ll": 6.8,        # baseLat[Ring|Tree][LL]
    "nvlink_ring_ll": 0.6, "nvlink_tree_ll": 0.6,    # hwLat[NVLINK][Ring|Tree][LL], per step
    "net_ring_ll": 2.7, "net_tree_ll": 5.0,          # hwLat[NET][Ring|Tree][LL], per inter-node step
    "net_overhead": 1.0,                             # getNetOverhead: per step of a ring spanning nodes (x86)
}
NCCL_LATENCY_SOURCE = "NVIDIA/nccl src/graph/tuning.cc @ b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2 (baseLat, hwLat, " \
    "getNetOverhead; the all-reduce latency of ncclTopoTuneModel for Ring and Tree, LL protocol)"


def part(name: str) -> Optional[Part]:
    """The part `cluster.gpu` names (case-insensitive), or None."""
    for n, p in PARTS.items():
        if n.lower() == str(name or "").lower():
            return p
    return None


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
