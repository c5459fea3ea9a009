"""vrun: compose, check and launch verl + Megatron Lite runs.

Imports nothing heavy: `pkg://vrun.compose.mlite_record.config` on a Hydra search path imports this package.
"""
