"""verl's side of a plan: which verl and `verl_mlite` the plan is composed against (`stack.py`, `mlite.py` with
its record in `mlite_record/`), verl's own config tree composed (and kept for the next plan) and overridden once
(`verl_tree.py`), its interpolations resolved (`interpolation.py`), the run config translated into verl's request
(`translate.py`) and the installed verl's closed choices read from its source (`verl_values.py`).

May import: `vrun.core`, `vrun.config`, `vrun.rundir` (the state dir, where a composed verl tree is kept),
`vrun.estimate`, `vrun.entrypoints`.
"""
