"""Running a plan: the task a Hydra job runs (`task.py`: typed config → plan → report → preflight → hand-off,
by mode), checks that need the target machine (`preflight.py`, `preflight_nodes.py`), the local hand-off
(`local.py`), the job entry (`entry.py`: checks the plan's stack, then verl's main_ppo on the saved config) and
SLURM (`slurm/`).

May import every layer below it; nothing imports it but `vrun.runs`, `runner.py` and the Hydra plugins.
"""
