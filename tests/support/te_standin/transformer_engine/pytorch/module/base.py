"""Placeholders for transformer_engine.pytorch.module.base (workspace helpers of the forward pass)."""
from transformer_engine.pytorch import _placeholder


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder("module.base." + name)
