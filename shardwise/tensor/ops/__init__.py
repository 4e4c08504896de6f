"""Sharding rules, one op family per module; importing this package registers them all."""

from . import embedding, foreach, matmul, nn, norm, pointwise, random, reduction, view  # noqa: F401
from . import indexing, losses, spatial, structure  # noqa: F401
from . import copies, replicate_only  # noqa: F401  (last: they read what the others registered)
