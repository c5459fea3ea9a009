"""SLURM: `submit.py` on the login node (the sbatch job from the cluster group and the mesh, confirmation,
submission, `resubmit`), `launcher_knobs.py` (a `hydra.launcher.*` value put onto its knob; the point's checks),
`checks.py` (what is checked before sbatch: the login preflight, shared storage, the partition's limits, sbatch's
refusals mapped to fixes; the same checks on a node), `wait.py` and `watch.py` (the submitter's wait: progress, the
outcome read from the run dir and squeue, never blocking), `node.py` on every allocated node (the control dir, Ray
head/worker or torchrun, failure propagation; a stall's dump and action in `node_stall.py`, the checks before
anything starts in `node_checks.py`), `procs.py` (a job's ports, the node's address, its children's
lifecycle).
"""
