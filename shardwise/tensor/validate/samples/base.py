"""What a validator sample is (``Sample``, ``Plain``), the deterministic tensor maker, and the op ->
builder registry the per-family sample files fill with ``@_on(op)``.

Shapes mix sizes not divisible by the mesh sizes 2..4 and sizes smaller than them, so shards come out
uneven or empty. A builder takes ``(op, maker)`` and returns ``[S(...)]``.

>>> @_on(aten.t.default)                 # in samples/shape/view.py; again here, it would replace that  # doctest: +SKIP
... def _t(op, m):
...     return [S(m.f(5, 3))]
>>> import shardwise.tensor.validate.samples   # the per-family files register their builders
>>> [s.label for s in sample_inputs(torch.ops.aten.t.default)]
['f32[5,3]', 'f32[3]']
"""
from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

__all__ = ["Sample", "Plain", "S", "sample_inputs"]

_DT = {torch.float32: "f32", torch.float64: "f64", torch.int64: "i64", torch.bool: "b", torch.int32: "i32"}


@dataclass(frozen=True)
class Plain:
    """Marks a 0-d tensor argument passed as a plain torch.Tensor, not a DTensor."""

    t: torch.Tensor


def _label(x) -> str:
    if isinstance(x, Plain):
        return "plain " + _label(x.t)
    if isinstance(x, torch.Tensor):
        return f"{_DT.get(x.dtype, str(x.dtype))}[{','.join(map(str, x.shape))}]"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(_label(y) for y in x) + "]"
    if x is sys.maxsize:
        return "max"
    return repr(x).replace("torch.", "")


@dataclass
class Sample:
    """One call of an op on full tensors. ``plain`` holds the tensor-leaf indices of plain tensors
    (give them as ``Plain(t)``); ``undefined``: the op's values are uninitialised (empty_like), only
    shapes are compared; ``random``: the RNG is reseeded with ``seed`` before every call.

    >>> s = Sample((torch.ones(5, 3), Plain(torch.tensor(2.0))))
    >>> s.label, s.plain
    ('f32[5,3], plain f32[]', frozenset({1}))
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    undefined: bool = False
    random: bool = False
    seed: int = 0
    plain: frozenset = frozenset()
    label: str = ""

    def __post_init__(self):
        parts = [_label(a) for a in self.args] + [f"{k}={_label(v)}" for k, v in self.kwargs.items()]
        self.label = self.label or ", ".join(parts)
        plain, n, args = set(), 0, []
        for a in self.args:
            if isinstance(a, (Plain, torch.Tensor)):
                plain.update([n] if isinstance(a, Plain) else [])
                n += 1
                args.append(a.t if isinstance(a, Plain) else a)
            elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
                n += sum(isinstance(x, torch.Tensor) for x in a)
                args.append(list(a))
            else:
                args.append(a)
        for k, v in self.kwargs.items():
            if isinstance(v, (Plain, torch.Tensor)):
                plain.update([n] if isinstance(v, Plain) else [])
                n += 1
                self.kwargs[k] = v.t if isinstance(v, Plain) else v
        self.args, self.plain = tuple(args), frozenset(plain)


def S(*args, **kwargs) -> Sample:
    return Sample(args, kwargs)


class _Maker:
    """Deterministic small tensors."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def f(self, *shape):
        return torch.randn(shape, generator=self.gen)

    def pos(self, *shape):
        return torch.rand(shape, generator=self.gen) + 0.5

    def fi(self, *shape):  # integer-valued floats: comparisons see ties
        return torch.randint(-2, 3, shape, generator=self.gen).float()

    def i(self, *shape, lo=0, hi=8):
        return torch.randint(lo, hi, shape, generator=self.gen)

    def b(self, *shape):
        return torch.rand(shape, generator=self.gen) < 0.5


_BUILDERS: dict = {}


def _on(*ops):
    def deco(fn: Callable):
        for op in ops:
            _BUILDERS[op] = fn
        return fn

    return deco


def sample_inputs(op, seed: int = 0) -> Optional[list]:
    """The samples of ``op`` (None when it has none), made deterministically from ``seed``."""
    fn = _BUILDERS.get(op)
    if fn is None:
        return None
    return fn(op, _Maker(seed * 1000003 + zlib.crc32(str(op).encode())))


def _value(type_name: str, integral: bool):
    if type_name in ("int", "SymInt"):
        return 1
    if type_name in ("float", "Scalar", "number"):  # a Scalar's type prints as "number"
        return 1 if integral and type_name != "float" else 0.5
    if type_name == "bool":
        return False
    raise TypeError(type_name)


def from_schema(op, m: _Maker, shapes) -> Optional[Sample]:
    """A sample built from the op's schema alone: its required tensors of ``shapes`` (the last shape
    repeats) of the first dtype the op accepts (positive floats, small integers, bools), 1 or 0.5 for
    each required number. None when no dtype runs (the op needs arguments of another kind)."""
    for make, integral in ((m.pos, False), (m.i, True), (m.b, True)):
        args, k = [], 0
        try:
            for a in op._schema.arguments:
                if a.has_default_value() or a.kwarg_only:
                    continue
                t = str(a.type)
                if t.startswith("Tensor") and "[]" not in t:
                    args.append(make(*shapes[min(k, len(shapes) - 1)]))
                    k += 1
                else:
                    args.append(_value(t, integral))
            if not k:
                return None
            op(*[x.clone() if isinstance(x, torch.Tensor) else x for x in args])
        except (TypeError, RuntimeError, NotImplementedError, ValueError, IndexError):
            continue
        return Sample(tuple(args))
    return None


def schema_samples(*shape_sets):
    """A builder making one ``from_schema`` sample per shape set (those the op accepts)."""

    def build(op, m):
        found = [from_schema(op, m, shapes) for shapes in shape_sets]
        return [s for s in found if s is not None]

    return build
