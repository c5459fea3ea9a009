"""Running planned points: what the sweeper hands a launcher (`points.py`), checks that need the target machine
(`preflight.py`, `preflight_nodes.py`), the environment a run's processes start with (`environment.py`, local and on
every node), the local launch by mode (`local.py`), the job entry (`entry.py`: checks the plan's stack, then verl's
main_ppo on the saved config), the watchdog (`watchdog.py`; in a Ray job's entry: `raywatch.py`, the job seen from
its own driver in `rayjob_own.py`), a stall's stacks taken (`stacks.py`) and read back (`stall_summary.py`), the
job's deadline (`deadline.py`), a standing Ray cluster's Job Submission API (`rayjobs.py`; its dashboard and shape:
`ray_dashboard.py`), KubeRay's RayJob (`kuberay.py`, its checks `kuberay_checks.py`, its API's fields
`kuberay_schema.py`, kubectl's answers `kubectl.py`) and SLURM (`slurm/`). The Hydra plugins in hydra_plugins/ (the
sweeper that plans, the launchers that call in here) are its only callers besides `runs`.

May import every layer below it; nothing imports it but `vrun.runs`, `runner.py` and the Hydra plugins.
"""
