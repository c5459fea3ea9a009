"""The typed run config: the schema Hydra composes `conf/` against (`schema.py`: the mesh knobs, the model with its
architecture facts, algo, data, cluster, run), registered in Hydra's ConfigStore, and `typed()` which turns a
composed DictConfig into those objects once; and how composing it fails, as one line (`cli_errors.py`).

May import: `vrun.core`.
"""
