"""vrun: compose, check and launch verl + Megatron Lite runs.

Imports nothing heavy: `pkg://vrun.mlite_record.config` on a Hydra search path imports this package.
"""
