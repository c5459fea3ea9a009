"""The arithmetic of a plan, as pure functions of typed inputs: the mesh and its rules (`mesh.py`: one frozen,
validated `Mesh`), parameter counts from the architecture facts (`params.py`) or a checkpoint's headers
(`checkpoint.py`; its config.json read in `checkpoint_config.py`, a shard's tensors counted in
`checkpoint_tensors.py`), what a decoder layer keeps for backward (`activations.py`), per-GPU memory of the training phase
per pipeline stage with the band of how each term is known (`memory.py`) and of the rollout with
its KV cache (`rollout.py`), GPU parts with their memory, FLOP/s and bandwidths (`hardware.py`), the step time
(`steptime.py`, its factors, workload, collectives, rollout and refit in `steptime_*.py`), every valid mesh of a GPU count and a mesh's valid neighbours (`meshes.py`), `mesh=auto`'s
ranking (`search.py`) and a time limit against verl's pre-deadline save
(`timelimit.py`). Each formula cites its source.

May import: `vrun.core`, `vrun.config`. No I/O beyond reading a checkpoint's JSON headers; no Hydra or verl.
"""
