"""Torch's flight recorder as the plan turns it on: the environment every process of the run starts with, what the
installed torch can record and analyse, and the plan table's `recorder` row. The stall-time side (asking the ranks,
gathering and analysing their dumps) is vrun.launch.flightrec.

The environment (`env`): the recorder's ring of TRACE_ENTRIES collectives per rank, for NCCL
(TORCH_NCCL_TRACE_BUFFER_SIZE, dumped on its own timeout and through its debug-info pipe: TORCH_NCCL_DUMP_ON_TIMEOUT,
TORCH_NCCL_DEBUG_INFO_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_PIPE_FILE, under <run dir>/stalls/nccl/) and for the CPU
backends (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE under <run dir>/stalls/fr/), and VRUN_FR_DIR, the dir where
the stack hook's listener (vrun/launch/stackhook/vrun_frdump.py) takes a stall's request and leaves its rank's dump.

What torch can (`support`) is read from its files, never by importing it: its version (torch/version.py), its
analyser (torch/distributed/flight_recorder/components/builder.py), and the bindings libtorch_python.so carries:
`_dump_fr_trace_json` (the process-wide recorder gloo writes to) and `_dump_nccl_trace_json` (a CUDA build's NCCL
recorder), the JSON dumps the listener asks for.
"""
from __future__ import annotations

import importlib.util
import mmap
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core import fs

TRACE_ENTRIES = 2000        # collectives kept per rank (torch's own default is 0: off)
REQUEST_ENV = "VRUN_FR_DIR"
STALLS = "stalls"
FR, NCCL = "fr", "nccl"     # the dirs under stalls/ the ranks dump into
PREFIX = "rank_"            # torch's analyser reads the rank from the file name after it
CPU_DUMP = b"_dump_fr_trace_json\x00"
NCCL_DUMP = b"_dump_nccl_trace_json\x00"


def env(run_dir: str) -> dict:
    """The variables that turn the recorder on for this run, dumping under <run dir>/stalls/."""
    stalls = Path(run_dir) / STALLS
    nccl, fr = str(stalls / NCCL / PREFIX), stalls / FR
    n = str(TRACE_ENTRIES)
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": n, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": nccl, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": nccl,
            "TORCH_FR_BUFFER_SIZE": n, "TORCH_FR_DUMP_TEMP_FILE": str(fr / PREFIX), REQUEST_ENV: str(fr)}


@dataclass(frozen=True)
class Support:
    """What the installed torch records and analyses."""
    torch: Optional[str]     # its version; None: no torch
    analyser: bool           # torch.distributed.flight_recorder's builder
    cpu: bool                # the process-wide recorder gloo writes to, and its dump
    nccl: bool               # a CUDA build's NCCL recorder

    def why_not(self, backend: str) -> str:
        """Why a stall on `backend` ("gloo" or "nccl") cannot name its collective ("" when it can)."""
        if self.torch is None:
            return "no torch is installed where the plan was made"
        if not self.analyser:
            return f"torch {self.torch} has no flight-recorder analyser (torch.distributed.flight_recorder)"
        if backend == "nccl" and not self.nccl:
            return f"torch {self.torch} records no NCCL collectives (a build without CUDA)"
        if backend != "nccl" and not self.cpu:
            return f"torch {self.torch} records no gloo collectives (no _dump_fr_trace_json)"
        return ""


def support(torch_dir: Optional[Path] = None) -> Support:
    """Support of the torch in `torch_dir` (default: the one this Python would import)."""
    if torch_dir is None:
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin:
            return Support(None, False, False, False)
        torch_dir = Path(spec.origin).parent
    torch_dir = Path(torch_dir)
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]{1,40})['\"]", fs.read_small(torch_dir / "version.py") or "")
    if m is None:
        return Support(None, False, False, False)
    builder = torch_dir / "distributed" / "flight_recorder" / "components" / "builder.py"
    cpu, nccl = _bindings(torch_dir / "lib" / "libtorch_python.so")
    return Support(m.group(1), fs.is_file(builder), cpu, nccl)


def _bindings(lib: Path) -> tuple[bool, bool]:
    try:
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(CPU_DUMP) >= 0, m.find(NCCL_DUMP) >= 0
    except (OSError, ValueError):
        return False, False


def line(s: Support, cluster: str = "") -> str:
    """The plan table's row, below `watch`: whether a stall will name its stuck collective, and how."""
    head = "recorder"
    if s.torch is None or not s.analyser:
        return f"{head} a stall names no collective: {s.why_not('gloo')}"
    ways = ["NCCL through the stack hook's listener and NCCL's debug-info pipe" if s.nccl else
            "no NCCL: a build without CUDA",
            "gloo through the stack hook's listener" if s.cpu else "no gloo: this torch records none"]
    ray = cluster in ("ray", "kuberay")
    reach = ("; on a Ray job the listener starts with each worker (Ray's worker_process_setup_hook) and the dumps "
             "need the run dir on storage every node reaches" if ray else "")
    return (f"{head} torch {s.torch}'s flight recorder on ({TRACE_ENTRIES:,} collectives per rank, dumps under "
            f"<run dir>/stalls/): a stall asks every rank for its dump ({', '.join(ways)}) and names the stuck "
            f"collective and the ranks missing from it (torch's analyser){reach}")
