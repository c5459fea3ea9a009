"""A CPU stand-in for TransformerEngine (a CUDA-only package), for the memory oracle only
(tests/support/mlite_memory_oracle.py). It gives the modules Megatron Lite builds from TransformerEngine the
parameters TransformerEngine gives them — names, shapes, dtypes — and nothing else: no forward pass. Names the
oracle's builds only import (kernels, permutation, router helpers) are placeholders that raise when called.

Put on sys.path only AFTER megatron.core is imported, so that megatron.core does not take TransformerEngine as
installed. Parameter layouts, from TransformerEngine's modules (transformer_engine/pytorch/module/):
  Linear          weight (out/tp, in) for parallel_mode "column", (out, in/tp) for "row", (out, in) otherwise;
                  bias (out/tp) column, (out) row/none — only when bias=True
  LayerNormLinear layer_norm_weight (in) [+ layer_norm_bias (in) for LayerNorm], then as Linear
  GroupedLinear   weight0..weight{n-1}, each (out, in) (tp split as Linear), bias0.. when bias=True
  RMSNorm         weight (hidden); LayerNorm weight and bias (hidden)
  DotProductAttention: no parameters
"""
