"""The plan: `make_plan` (`plan.py`, its only caller is the task) puts the stages below together — mesh, the
entrypoint's record, verl's tree, the checks, parameter counts, memory phases (`phases.py`) — into one `Plan`;
`report.py` renders it (the table, plan.json, verl_config.yaml); `manifest.py` writes manifest.json.

May import every layer below: `vrun.core`, `config`, `rundir`, `estimate`, `entrypoints`, `compose`, `checks`.
"""
