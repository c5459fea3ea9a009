"""A run dir's files and how they are read back: progress lines (`progress.jsonl`), plan.json's format version,
the index of run dirs in the user's state dir (`records.py`), and one run dir read back as a typed `Run`
(`state.py`: plan, progress, SLURM job, state and reason) for the runs verbs and the submitter's progress.

May import: `vrun.core`, `vrun.config`. Imports nothing heavy (no Hydra, verl, torch or Ray).
"""
