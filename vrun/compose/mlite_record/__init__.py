"""The project's record of the `verl_mlite.config` interface (Megatron-LM `experimental/lite/examples/verl`).

Used to compose plans where the real `verl_mlite` is not importable. It carries the same group files, keys
and defaults as the real package at the commit in `record.yaml`, plus the facts about what the engine keeps
(`impl_cfg` fields per model, the optimizer override keys it reads). `tests/test_mlite_record.py` compares
it with a real checkout when MLITE_ROOT is set. Never named `verl_mlite`: it must not shadow the real one.
"""
