"""The plan: `make_plan` (`plan.py`) puts the stages below together — mesh, the entrypoint's record, verl's tree,
the checks, the model path (`model_path.py`), parameter counts (`param_counts.py`), memory phases (`phases.py`) and
their verdict with its fixes (`memory_verdict.py`), mesh=auto's search (`auto_mesh.py`), step time and cost
(`steptime_plan.py`, calibrated from earlier runs by `calibration.py`, measured against them by `measured.py`) —
into one `Plan`; `report.py` renders it (the table, plan.json, verl_config.yaml), `picture.py` draws plan.svg (its
panels in `drawing.py`), `manifest.py` writes manifest.json.

May import every layer below: `vrun.core`, `config`, `rundir`, `estimate`, `entrypoints`, `compose`, `checks`.
"""
