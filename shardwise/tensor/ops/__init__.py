"""Sharding rules, one op family per module; importing this package registers them all."""

from . import foreach, matmul, nn, pointwise, reduction, view  # noqa: F401
