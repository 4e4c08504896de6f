"""Sample inputs for the rule validator: small full tensors for every registered op, one file per op
family of ``shardwise/tensor/ops`` (``pointwise.py`` holds the samples of ``ops/pointwise.py``, ...).

Comparison ops get integer-valued floats (so ties occur), ops with a restricted domain (log, sqrt,
division) get positive values. A newly registered op needs a builder in its family's file
(``@_on(op)`` returning ``[S(...)]``): tests/tensor/validate/test_checker.py fails for ops without
samples.

>>> from torch.ops import aten
>>> [s.label for s in sample_inputs(aten.mm.default)]
['f32[5,3], f32[3,4]', 'f32[2,5], f32[5,3]']
"""

# importing a family registers its builders
from . import attention, complex, embedding, foreach, fused_optim, matmul, nn, norm, pointwise, random, reduction, view  # noqa: F401
from .base import Plain, S, Sample, sample_inputs

__all__ = ["Sample", "Plain", "S", "sample_inputs"]
