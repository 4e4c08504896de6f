"""Foreach (multi-tensor) ops used by torch.optim: each list element is its own pointwise op.

Element ``i`` of every tensor list takes the placements of the first list's element ``i``. A pending
reduction there is resolved to Replicate unless the op is linear in it (scaling, zeroing, copying).
"""

from __future__ import annotations

import torch
from torch.ops import aten

from ...placements import Partial, Replicate
from ...propagation.propagator import Decision
from ...propagation.registry import register_rule
from ...propagation.schema import TensorArg

_LINEAR = {"_foreach_mul", "_foreach_mul_", "_foreach_div", "_foreach_div_", "_foreach_zero_", "_foreach_neg",
           "_foreach_neg_", "_foreach_copy_"}
# linear in the first list only, and only for pending sums/averages: a negative factor turns a max into a
# min, and a partial times a partial is not a partial of the product
_SCALING = {"_foreach_mul", "_foreach_mul_", "_foreach_div", "_foreach_div_", "_foreach_neg", "_foreach_neg_"}
_NAMES = [
    "add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "sqrt", "exp", "neg", "abs", "maximum",
    "minimum", "clamp_min", "clamp_max", "reciprocal", "sign", "pow", "zero", "copy", "rsqrt", "sigmoid",
    "tanh", "log",
]


def _ops():
    ops = []
    for n in _NAMES:
        for name in (f"_foreach_{n}", f"_foreach_{n}_"):
            if hasattr(aten, name):
                ops.append(getattr(aten, name))
    return ops


def _lists(schema):
    return [a for a in list(schema.args) + list(schema.kwargs.values()) if isinstance(a, list) and a and isinstance(a[0], TensorArg)]


def foreach_rule(schema, mesh_shape) -> Decision:
    name = schema.op._schema.name.split("::")[-1]
    inplace = name.endswith("_")
    lists = _lists(schema)
    first = lists[0]
    targets = []
    for i, head in enumerate(first):
        pl = head.placements or tuple(Replicate() for _ in mesh_shape)
        nonlinear = name not in _LINEAR or (name in _SCALING and any(
            isinstance(p, Partial) and not p.is_linear() for p in pl))
        if any(isinstance(p, Partial) for p in pl) and nonlinear:
            if inplace:
                raise NotImplementedError(
                    f"{schema.op}: element {i} is a pending reduction {[str(p) for p in pl]} updated in place by "
                    "a non-linear op; redistribute it to Replicate() (or Shard) first"
                )
            pl = tuple(Replicate() if isinstance(p, Partial) else p for p in pl)
        targets.append(pl)
    inputs = []
    for ta in schema.tensor_args:
        if ta.placements is None:
            inputs.append(None)
            continue
        li, pos = next(((j, k) for j, lst in enumerate(lists) for k, t in enumerate(lst) if t is ta), (0, None))
        target = targets[pos] if pos is not None else tuple(Replicate() for _ in mesh_shape)
        if li > 0 and name in _SCALING:  # the other factor must be replicated where the first is partial
            target = tuple(Replicate() if isinstance(p, Partial) else p for p in target)
        inputs.append(None if target == ta.placements else target)
    outputs = [None if o is None else targets[k % len(targets)] for k, o in enumerate(schema.outputs)]
    return Decision(inputs, outputs)


register_rule(*_ops(), pointwise=True, whole_mesh=True)(foreach_rule)
