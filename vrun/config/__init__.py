"""The typed run config: the schema Hydra composes `conf/` against (`schema.py`: Mesh knobs, Model with its
architecture facts, Algo, Data, Cluster, Run), registered in Hydra's ConfigStore, and `typed()` which turns a
composed DictConfig into those frozen objects once.

May import: `vrun.core`.
"""
