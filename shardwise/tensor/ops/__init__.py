"""Sharding rules, one op family per module, grouped by concept; importing this package registers them all.

| subpackage | families |
|---|---|
| ``numeric/`` | ``pointwise``, ``reduction``, ``matmul``, ``norm``, ``random`` |
| ``shape/`` | ``view``, ``structure``, ``indexing``, ``complex`` |
| ``nn/`` | ``functional`` (softmax, nll_loss, layer_norm), ``losses``, ``spatial``, ``attention``, ``embedding`` |
| ``optim/`` | ``foreach``, ``fused_optim`` |

``common.py`` holds the helpers they share; ``copies.py`` and ``replicate_only.py`` derive from what the
families registered. A later registration replaces an earlier one, so the families are imported here, one
by one, in a fixed order (the subpackages' ``__init__`` import nothing, so importing one does not change it).
"""

from .nn import attention  # noqa: F401
from .shape import complex  # noqa: F401
from .nn import embedding  # noqa: F401
from .optim import foreach, fused_optim  # noqa: F401
from .numeric import matmul  # noqa: F401
from .nn import functional  # noqa: F401
from .numeric import norm, pointwise, random  # noqa: F401
from .numeric import reduction  # noqa: F401
from .shape import view  # noqa: F401
from .shape import indexing  # noqa: F401
from .nn import losses, spatial  # noqa: F401
from .shape import structure  # noqa: F401
from . import copies, replicate_only  # noqa: F401  (last: they read what the others registered)
