"""Sample inputs for the rule validator: small full tensors for every registered op, one file per op
family of ``shardwise/tensor/ops``, in the same subpackages (``numeric/pointwise.py`` holds the samples
of ``ops/numeric/pointwise.py``, ...; ``families.py`` those of structure, indexing, losses and spatial).

Comparison ops get integer-valued floats (so ties occur), ops with a restricted domain (log, sqrt,
division) get positive values. A newly registered op needs a builder in its family's file
(``@_on(op)`` returning ``[S(...)]``): tests/tensor/validate/test_checker.py fails for ops without
samples.

>>> from torch.ops import aten
>>> [s.label for s in sample_inputs(aten.mm.default)]
['f32[5,3], f32[3,4]', 'f32[2,5], f32[5,3]']

An op without a builder gets samples built from its schema (``base.from_schema``), else the arguments
torch's OpInfo samples call it with (``opdb.py``: slow, imports ``op_db``).
"""

# importing a family registers its builders
# (in a fixed order: a later builder for an op replaces an earlier one; the subpackages import nothing)
from .nn import attention  # noqa: F401
from .shape import complex  # noqa: F401
from .nn import embedding  # noqa: F401
from .optim import foreach, fused_optim  # noqa: F401
from .numeric import matmul  # noqa: F401
from .nn import functional  # noqa: F401
from .numeric import norm, pointwise, random, reduction  # noqa: F401
from .shape import view  # noqa: F401
from . import families  # noqa: F401
from .base import Plain, S, Sample, _BUILDERS, _Maker, schema_samples
from .base import sample_inputs as _built

__all__ = ["Sample", "Plain", "S", "sample_inputs", "source"]

_FROM_SCHEMA = schema_samples([(4, 4)], [(5, 3), (3,)])


def sample_inputs(op, seed: int = 0, recorded: bool = True):
    """The samples of ``op``: its builder's, else built from its schema, else (``recorded``) from
    torch's OpInfo samples; None when there are none."""
    found = _built(op, seed)
    if found is None:
        found = _FROM_SCHEMA(op, _Maker(seed * 1000003 + 17)) or None
    if found is None and recorded:
        from .opdb import recorded_samples
        from ...propagation.registry import registered_ops

        unbuilt = [o for o in registered_ops() if o not in _BUILDERS]
        found = recorded_samples(tuple(unbuilt)).get(op)
    return found


def source(op) -> str:
    """Where ``op``'s samples come from: "builder", "schema" or "op_db"."""
    if op in _BUILDERS:
        return "builder"
    return "schema" if _FROM_SCHEMA(op, _Maker(0)) else "op_db"
