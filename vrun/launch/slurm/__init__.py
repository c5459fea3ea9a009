"""SLURM: `submit.py` on the login node (the sbatch job from the cluster group and the mesh, confirmation,
submission, `resubmit`), `node.py` on every allocated node (the control dir, Ray head/worker or torchrun, failure
propagation), `watch.py` (progress while a submission waits).
"""
