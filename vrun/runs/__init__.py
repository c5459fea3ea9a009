"""`python -m vrun <verb>`: the runs the project wrote — list, status, logs, cancel, diff, export, resubmit.

Reads run dirs (plan.json, progress.jsonl, slurm_job.json, manifest.json, verl_config.yaml) and asks SLURM only
what the run dir cannot know. Imports nothing heavy.

The top layer: may import every package below it (`resubmit` and `cancel` go through `vrun.launch`).
"""
