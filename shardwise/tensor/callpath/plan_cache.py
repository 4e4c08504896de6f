"""The dispatcher's cache keys and its bounded plan cache (see dispatch.py for how they are used).

A key is built from small hashable values only: the op, each DTensor's spec, each plain tensor's
shape/dtype, the non-tensor arguments. ``quick_key`` is the cheaper key of calls that take DTensors,
scalars and int lists only.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["PropagationCache", "seq_key", "has_tensor", "quick_key"]


def has_tensor(seq) -> bool:
    return bool(seq) and (isinstance(seq[0], torch.Tensor) or any(isinstance(x, torch.Tensor) for x in seq))


def seq_key(seq, cls) -> tuple[tuple, list]:
    """Cache-key part and local list of a list argument holding tensors. Tensors enter keys by spec
    (DTensor) or shape/dtype (plain), never by identity (aten.index takes ``[None, idx]`` lists)."""
    part = tuple(x._spec if isinstance(x, cls) else (x.shape, x.dtype) if isinstance(x, torch.Tensor) else x
                 for x in seq)
    return part, [x._local_tensor if isinstance(x, cls) else x for x in seq]


class PropagationCache:
    """Bounded map key -> OpPlan with hit/miss counters (tests count hits).

    ``quick`` holds the plans that run the op on the local tensors as they are (no redistribution, no
    local rewrite), keyed more cheaply (see ``quick_key``); a hit there counts as a hit."""

    def __init__(self, max_size: int = 8192):
        self.max_size = max_size
        self.plans: dict = {}
        self.quick: dict = {}
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()  # eviction by two threads at once would pop one key twice

    def clear(self) -> None:
        self.plans.clear()
        self.quick.clear()
        self.hits = self.misses = 0

    def put(self, key, plan) -> None:
        with self._lock:  # only on a miss: never on the hot path
            if len(self.plans) >= self.max_size:
                self.plans.pop(next(iter(self.plans)))
            self.plans[key] = plan

    def put_quick(self, qkey, plan) -> None:
        if plan.redist or plan.local is not None or plan.guard is not None or plan.out_kind not in ("tensor", "inplace"):
            return  # plans made under a switch must re-check it on every hit (the full path does)
        if plan.out_kind == "inplace" and plan.out_specs[0] != qkey[1]:
            return  # an in-place op changing its argument's spec (squeeze_) takes the full path
        with self._lock:
            if len(self.quick) >= self.max_size:
                self.quick.pop(next(iter(self.quick)))
            # the op's C++ callable: calling the OpOverload adds a Python frame per hit; fresh: the result
            # is a new tensor, never a view (wrapping.py: the cheaper constructor needs no view checks)
            op = qkey[0]
            fresh = not any(r.alias_info is not None for r in op._schema.returns)
            self.quick[qkey] = (plan.out_specs[0], plan.out_kind == "inplace", getattr(op, "_op", op), fresh)


def quick_key(op, args, cls):
    """A cheap cache key for a call whose arguments are DTensors (the first one a DTensor), scalars
    and lists of ints, else None. Scalars enter with their type: ``x * 1`` and ``x * 1.0`` (or a bool
    tensor times ``True``) have different output dtypes, and ``1 == 1.0 == True`` as dict keys."""
    a = args[0] if args else None
    if type(a) is not cls:
        return None
    if len(args) == 1:
        return (op, a._spec)
    key = [op, a._spec]
    for x in args[1:]:
        t = type(x)
        if t is cls:
            key.append(x._spec)
        elif t is int or t is float or t is bool:
            key.append(t)
            key.append(x)
        elif (t is list or t is tuple) and all(type(v) is int for v in x):
            key.append(tuple(x))
        elif x is None:
            key.append(None)
        else:
            return None
    return tuple(key)
