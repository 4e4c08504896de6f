"""Sharding rules, one op family per module; importing this package registers them all."""

from . import attention, complex, embedding, foreach, fused_optim, matmul, nn, norm, pointwise, random, reduction, view  # noqa: F401
