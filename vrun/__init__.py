"""vrun: compose, check and launch verl + Megatron Lite runs.

The packages are the stages a run passes through, each importing only the ones before it
(tests/test_structure.py keeps this true):

  core         Problem, PlanError, the dotted lookup
  config       the typed run config Hydra composes conf/ against
  rundir       a run dir's files: plan.json as a typed record, progress lines, the index, a run read back
  estimate     the arithmetic: mesh, parameters, memory, rollout, GPU parts, mesh search
  entrypoints  one record per verl entrypoint (PPO on Ray, SFT under torchrun)
  compose      verl's side: the stack, verl_mlite, verl's tree, the translation, verl's closed choices
  checks       what a plan refuses
  planning     make_plan and its report (table, plan.json, verl_config.yaml, manifest.json)
  launch       the planned points, preflight, local and SLURM launch, the job entry on the node
  runs         `python -m vrun <verb>` over the run dirs

Imports nothing heavy: `pkg://vrun.compose.mlite_record.config` on a Hydra search path imports this package.
"""
