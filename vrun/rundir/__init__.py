"""A run dir's files and how they are read back: the plan as plan.json holds it, with its format version
(`record.py`: PlanRecord, the one (de)serialiser), progress lines, the run id and the index of run dirs in the
user's state dir (`records.py`), every file validated before use (`files.py`), one run dir read back as a typed
`Run` (`state.py`; the types in `run_types.py`, an attempt seen through SLURM in `slurm_attempt.py`), the
decisive line of a failed job's log (`cause.py`) and verl's per-step timings in the job's log (`joblog.py`).

May import: `vrun.core`, `vrun.config`. Imports nothing heavy (no Hydra, verl, torch or Ray).
"""
