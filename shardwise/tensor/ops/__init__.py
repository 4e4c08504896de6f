"""Sharding rules, one op family per module; importing this package registers them all."""

from . import attention, complex, embedding, foreach, fused_optim, matmul, nn, norm, pointwise, random  # noqa: F401
from . import reduction, view  # noqa: F401
from . import indexing, losses, spatial, structure  # noqa: F401
from . import copies, replicate_only  # noqa: F401  (last: they read what the others registered)
