"""Placeholders for transformer_engine.common.recipe (fp8 recipes: not used by a bf16 build)."""


class Format:
    HYBRID = "HYBRID"
    E4M3 = "E4M3"


class DelayedScaling:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
