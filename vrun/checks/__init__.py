"""What a plan refuses: the checks on the raw and typed run config before anything is written (`guard.py`:
secrets, names, run dirs, ranges, lengths, models) and the checks on the resolved verl config against the mesh
and Megatron Lite's rules (`plan_checks.py`). Each reports `Problem`s; none raises or prints.

May import: `vrun.core`, `vrun.config`, `vrun.rundir`, `vrun.estimate`, `vrun.entrypoints`, `vrun.compose`.
"""
