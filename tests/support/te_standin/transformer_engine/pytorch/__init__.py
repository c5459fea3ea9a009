"""Stand-ins for transformer_engine.pytorch's modules: parameters with TransformerEngine's layout (see the
package docstring), no compute."""
from __future__ import annotations

import torch
import torch.nn as nn


def _dtype(params_dtype):
    return params_dtype if params_dtype is not None else torch.get_default_dtype()


def _split(out_features: int, in_features: int, parallel_mode, tp_size: int) -> tuple[int, int]:
    tp = tp_size or 1
    if parallel_mode == "column":
        return out_features // tp, in_features
    if parallel_mode == "row":
        return out_features, in_features // tp
    return out_features, in_features


class _NoForward(nn.Module):
    def forward(self, *args, **kwargs):  # pragma: no cover - the oracle never runs a forward pass
        raise NotImplementedError(f"{type(self).__name__} is a parameter-layout stand-in: it has no forward")


class Linear(_NoForward):
    def __init__(self, in_features, out_features, bias=True, *, params_dtype=None, parallel_mode=None,
                 tp_size=1, device=None, **_):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        out, inp = _split(out_features, in_features, parallel_mode, tp_size)
        dt = _dtype(params_dtype)
        self.weight = nn.Parameter(torch.empty(out, inp, dtype=dt, device=device))
        self.use_bias = bool(bias)
        if bias:
            self.bias = nn.Parameter(torch.empty(out if parallel_mode == "column" else out_features, dtype=dt,
                                                 device=device))


class LayerNormLinear(Linear):
    def __init__(self, in_features, out_features, bias=True, *, normalization="LayerNorm", params_dtype=None,
                 device=None, **kw):
        super().__init__(in_features, out_features, bias, params_dtype=params_dtype, device=device, **kw)
        dt = _dtype(params_dtype)
        self.layer_norm_weight = nn.Parameter(torch.empty(in_features, dtype=dt, device=device))
        if normalization == "LayerNorm":
            self.layer_norm_bias = nn.Parameter(torch.empty(in_features, dtype=dt, device=device))


class GroupedLinear(_NoForward):
    def __init__(self, num_gemms, in_features, out_features, bias=True, *, params_dtype=None, parallel_mode=None,
                 tp_size=1, device=None, **_):
        super().__init__()
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        out, inp = _split(out_features, in_features, parallel_mode, tp_size)
        dt = _dtype(params_dtype)
        for i in range(num_gemms):
            self.register_parameter(f"weight{i}", nn.Parameter(torch.empty(out, inp, dtype=dt, device=device)))
            if bias:
                self.register_parameter(f"bias{i}", nn.Parameter(torch.empty(out, dtype=dt, device=device)))


class RMSNorm(_NoForward):
    def __init__(self, hidden_size, eps=1e-5, *, params_dtype=None, device=None, **_):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=_dtype(params_dtype), device=device))


class LayerNorm(_NoForward):
    def __init__(self, hidden_size, eps=1e-5, *, params_dtype=None, device=None, **_):
        super().__init__()
        dt = _dtype(params_dtype)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=dt, device=device))
        self.bias = nn.Parameter(torch.empty(hidden_size, dtype=dt, device=device))


class DotProductAttention(_NoForward):
    def __init__(self, *args, **kwargs):
        super().__init__()


def _placeholder(name: str):
    def call(*args, **kwargs):  # pragma: no cover - forward-pass kernels
        raise NotImplementedError(f"transformer_engine.pytorch.{name} is not available in the CPU stand-in")
    call.__name__ = name
    return call


def checkpoint(function, *args, **kwargs):  # pragma: no cover - forward pass only
    return function(*args, **kwargs)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)
