"""What a plan refuses, one module per concern, each reporting `Problem`s (none raises or prints): the composed
config before Hydra creates the run dir and once per point (`composed.py`: unknown keys, control characters,
the sweep's size, the stateless callback), secrets in any spelling (`secret.py`), names and run dirs
(`paths.py`), sbatch values and setup lines (`sbatch.py`), values and types as verl reads them (`values.py`), the
cluster's addresses and ports (`addresses.py`), the model group's facts as counts (`model_facts.py`), and the
resolved verl config against the mesh and Megatron Lite's rules (`plan_checks.py`).

May import: `vrun.core`, `vrun.config`, `vrun.rundir`, `vrun.estimate`, `vrun.entrypoints`, `vrun.compose`.
"""
