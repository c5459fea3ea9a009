"""Running a plan: the task a Hydra job runs (`task.py`: typed config → plan → report → preflight → hand-off,
by mode), checks that need the target machine (`preflight.py`, `preflight_nodes.py`), the local hand-off
(`local.py`), the job entry on the node (`entry.py`: verl's main_ppo on the saved config), SLURM
(`slurm/`: the login side that builds and submits the job, the node side that brings up Ray or torchrun, the
progress shown while a submission waits) and the one-line error presentation (`cli_errors.py`).

May import every layer below it; nothing imports it but `vrun.runs`, `runner.py` and the Hydra plugins.
"""
