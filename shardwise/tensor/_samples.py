"""Sample inputs for the rule validator: small full tensors for every registered op family.

Shapes mix sizes not divisible by the mesh sizes 2..4 and sizes smaller than them, so shards come out
uneven or empty. Comparison ops get integer-valued floats (so ties occur), ops with a restricted
domain (log, sqrt, division) get positive values. A newly registered op needs a builder here
(``@_on(op)`` returning ``[S(...)]``): tests/tensor/test_validate.py fails for ops without samples.

>>> from torch.ops import aten
>>> [s.label for s in sample_inputs(aten.mm.default)]
['f32[5,3], f32[3,4]', 'f32[2,5], f32[5,3]']
"""

from __future__ import annotations

import dataclasses
import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch.ops import aten

__all__ = ["Sample", "Plain", "sample_inputs"]

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


# --- pointwise ------------------------------------------------------------------------------------

_UNARY = [
    aten.abs.default, aten.exp.default, aten.relu.default, aten.gelu.default, aten.tanh.default,
    aten.sigmoid.default, aten.silu.default, aten.sin.default, aten.cos.default, aten.sign.default,
    aten.square.default, aten.erf.default, aten.expm1.default, aten.hardtanh.default, aten.leaky_relu.default,
    aten.elu.default, aten.nan_to_num.default, aten.isnan.default, aten.sgn.default, aten.floor.default,
    aten.ceil.default, aten.round.default, aten.trunc.default, aten.neg.default, aten.clone.default,
    aten.detach.default, aten.alias.default, aten.contiguous.default, aten.abs_.default, aten.exp_.default,
    aten.relu_.default, aten.neg_.default, aten.sigmoid_.default, aten.tanh_.default, aten.zeros_like.default,
    aten.ones_like.default, aten.zero_.default,
]
_UNARY_POS = [
    aten.log.default, aten.sqrt.default, aten.rsqrt.default, aten.reciprocal.default, aten.log1p.default,
    aten.sqrt_.default, aten.reciprocal_.default, aten.rsqrt_.default,
]


@_on(*_UNARY)
def _unary(op, m):
    return [S(m.f(5, 3)), S(m.f(2))]


@_on(*_UNARY_POS)
def _unary_pos(op, m):
    return [S(m.pos(5, 3)), S(m.pos(2))]


@_on(aten.empty_like.default)
def _empty_like(op, m):
    return [dataclasses.replace(s, undefined=True) for s in _unary(op, m)]


_ONE_SCALAR = {
    aten.hardtanh.default: (-0.5, 0.5), aten.leaky_relu.default: (0.2,), aten.elu.default: (0.5,),
    aten.threshold.default: (0.1, 20.0), aten.full_like.default: (2.5,), aten.fill_.Scalar: (1.5,),
    aten.copy_.int: (5,), aten.copy_.float: (2.5,), aten.clamp.default: (-0.5, 0.5),
    aten.clamp_.default: (-0.5, 0.5), aten.clamp_min.default: (0.1,), aten.clamp_min_.default: (0.1,),
    aten.clamp_max.default: (0.1,), aten.clamp_max_.default: (0.1,), aten.pow.Tensor_Scalar: (2.5,),
    aten.pow_.Scalar: (2,), aten.rsub.Scalar: (1.0,), aten.add.Scalar: (2.5,), aten.sub.Scalar: (2.5,),
    aten.mul.Scalar: (-2.0,), aten.div.Scalar: (-2.0,), aten.add_.Scalar: (2.5,), aten.sub_.Scalar: (2.5,),
    aten.mul_.Scalar: (-2.0,), aten.div_.Scalar: (-2.0,), aten.fmod.Scalar: (1.5,), aten.remainder.Scalar: (1.5,),
}


@_on(*_ONE_SCALAR)
def _with_scalars(op, m):
    scalars = _ONE_SCALAR[op]
    return [S(m.pos(5, 3), *scalars), S(m.f(2), *scalars), S(m.f(4, 3), *scalars)]


@_on(aten.div.Scalar_mode, aten.div_.Scalar_mode, aten.round.decimals)
def _scalar_kwarg(op, m):
    if op is aten.round.decimals:
        return [S(m.f(5, 3), decimals=1), S(m.f(2) * 10, decimals=-1)]
    return [S(m.f(5, 3), 0.7, rounding_mode="floor"), S(m.f(3), -2.0, rounding_mode="trunc")]


@_on(aten._to_copy.default)
def _to_copy(op, m):
    # float -> int truncates and float -> bool is not monotone: pending reductions must not pass
    return [S(m.f(5, 3)), S(m.f(5, 3), dtype=torch.float64), S(m.f(2, 3) * 3, dtype=torch.int64),
            S(m.f(3), dtype=torch.bool), S(m.i(4, 3), dtype=torch.float32)]


@_on(aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar)
def _compare_scalar(op, m):
    return [S(m.fi(5, 3), 0.0), S(m.fi(2), 1)]


@_on(aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor,
     aten.maximum.default, aten.minimum.default)
def _compare(op, m):
    return [S(m.fi(5, 3), m.fi(5, 3)), S(m.fi(5, 3), m.fi(3)), S(m.fi(5, 1), m.fi(1, 3)),
            S(m.fi(5, 3), Plain(m.fi()))]


_BINARY = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.atan2.default, aten.rsub.Tensor]
_BINARY_DIV = [aten.div.Tensor, aten.fmod.Tensor, aten.remainder.Tensor, aten.pow.Tensor_Tensor]
_BINARY_ = [aten.add_.Tensor, aten.sub_.Tensor, aten.mul_.Tensor, aten.copy_.default, aten.copy_.Tensor,
            aten.copy.default]  # copy(self, src) broadcasts src to self like the in-place forms
_BINARY_DIV_ = [aten.div_.Tensor, aten.pow_.Tensor, aten.clamp_min_.Tensor, aten.clamp_max_.Tensor]


@_on(*_BINARY, *_BINARY_DIV, aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _binary(op, m):
    a = m.pos if op in _BINARY_DIV else m.f
    b = m.pos if op in _BINARY_DIV else m.f
    out = [S(a(5, 3), b(5, 3)), S(a(5, 3), b(3)), S(a(5, 1), b(1, 3)), S(a(2, 3), b(2, 1)),
           S(a(5, 3), Plain(b())), S(a(5, 3), b())]
    if op in (aten.add.Tensor, aten.sub.Tensor, aten.rsub.Tensor):
        out.append(S(a(5, 3), b(5, 3), alpha=2))
    return out


@_on(*_BINARY_, *_BINARY_DIV_)
def _binary_inplace(op, m):
    a = m.pos if op in _BINARY_DIV_ else m.f
    out = [S(a(5, 3), a(5, 3)), S(a(5, 3), a(3)), S(a(2, 3), a(2, 1)), S(a(5, 3), Plain(a()))]
    if op in (aten.add_.Tensor, aten.sub_.Tensor):
        out.append(S(a(5, 3), a(5, 3), alpha=-0.5))
    return out


@_on(aten.div.Tensor_mode, aten.div_.Tensor_mode)
def _div_mode(op, m):
    return [S(m.f(5, 3) * 4, m.pos(3), rounding_mode="floor"), S(m.f(5, 3) * 4, m.pos(5, 3), rounding_mode="trunc")]


@_on(aten.bitwise_and.Tensor, aten.bitwise_or.Tensor)
def _bitwise(op, m):
    return [S(m.i(5, 3), m.i(5, 3)), S(m.i(5, 3), m.i(3)), S(m.b(5, 3), m.b(3))]


@_on(aten.bitwise_and.Scalar, aten.bitwise_or.Scalar)
def _bitwise_scalar(op, m):
    return [S(m.i(5, 3), 6), S(m.i(2), 3)]


@_on(aten.bitwise_and.Scalar_Tensor, aten.bitwise_or.Scalar_Tensor, aten.remainder.Scalar_Tensor, aten.pow.Scalar)
def _scalar_tensor(op, m):
    return [S(6, m.i(5, 3, lo=1)), S(3, m.i(2, lo=1))] + ([S(2.0, m.f(5, 3))] if op is aten.pow.Scalar else [])


@_on(aten.logical_and.default, aten.logical_or.default)
def _logical(op, m):
    return [S(m.b(5, 3), m.b(5, 3)), S(m.b(5, 3), m.b(3)), S(m.f(5, 3), m.b(5, 3))]


@_on(aten.logical_not.default, aten.bitwise_not.default)
def _not(op, m):
    return [S(m.b(5, 3)), S(m.b(2))] + ([S(m.i(5, 3))] if op is aten.bitwise_not.default else [S(m.fi(5, 3))])


@_on(aten.clamp.Tensor, aten.clamp_.Tensor)
def _clamp_tensor(op, m):
    return [S(m.f(5, 3), m.f(3) - 0.5, m.f(5, 3) + 0.5), S(m.f(5, 3), m.f(5, 1)), S(m.f(5, 3), None, m.f(3))]


@_on(aten.fill_.Tensor)
def _fill_tensor(op, m):
    return [S(m.f(5, 3), Plain(m.f())), S(m.f(5, 3), m.f()), S(m.f(2), m.f())]


@_on(aten.where.self)
def _where(op, m):
    return [S(m.b(5, 3), m.f(5, 3), m.f(3)), S(m.b(3), m.f(5, 1), m.f(5, 3)), S(m.b(2), m.f(2), Plain(m.f()))]


@_on(aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where_scalar(op, m):
    pick = {aten.where.Scalar: lambda *s: -2.0, aten.where.ScalarSelf: lambda *s: m.f(*s)}.get(op)
    if pick is not None:
        return [S(m.b(5, 3), 1.5, pick(3)), S(m.b(2), 1, pick(2))]
    return [S(m.b(5, 3), m.f(3), 1.5), S(m.b(2), m.f(2), 1.5)]


@_on(aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.masked_fill.Tensor, aten.masked_fill_.Tensor)
def _masked_fill(op, m):
    v = (lambda: Plain(m.f())) if op._overloadname == "Tensor" else (lambda: -1.5)
    out = [S(m.f(5, 3), m.b(5, 3), v()), S(m.f(5, 3), m.b(3), v()), S(m.f(2), m.b(2), v())]
    if op._overloadname == "Tensor":
        out.append(S(m.f(5, 3), m.b(3), m.f()))
    return out


@_on(aten.lerp.Scalar, aten.lerp_.Scalar, aten.lerp.Tensor, aten.lerp_.Tensor)
def _lerp(op, m):
    w = (lambda *s: m.f(*s)) if op._overloadname == "Tensor" else (lambda *s: 0.3)
    return [S(m.f(5, 3), m.f(5, 3), w(5, 3)), S(m.f(5, 3), m.f(3), w(3)), S(m.f(2), m.f(2), w(2))]


@_on(aten.addcmul.default, aten.addcmul_.default, aten.addcdiv.default, aten.addcdiv_.default)
def _addc(op, m):
    return [S(m.f(5, 3), m.f(5, 3), m.pos(5, 3), value=0.5), S(m.f(5, 3), m.f(3), m.pos(5, 1)),
            S(m.f(2), m.f(2), m.pos(2), value=-2)]


@_on(aten.threshold_backward.default, aten.gelu_backward.default, aten.tanh_backward.default,
     aten.sigmoid_backward.default, aten.silu_backward.default, aten.hardtanh_backward.default,
     aten.leaky_relu_backward.default)
def _backward(op, m):
    extra = {
        aten.threshold_backward.default: (0.1,), aten.hardtanh_backward.default: (-0.5, 0.5),
        aten.leaky_relu_backward.default: (0.2, False),
    }.get(op, ())
    out = [S(m.f(5, 3), m.f(5, 3), *extra), S(m.f(2), m.f(2), *extra)]
    if op is aten.gelu_backward.default:
        out.append(S(m.f(5, 3), m.f(5, 3), approximate="tanh"))
    return out


@_on(aten.threshold.default)
def _threshold(op, m):
    return [S(m.f(5, 3), 0.1, 20.0), S(m.f(2), 0.0, -1.0)]


@_on(aten.native_dropout.default)
def _dropout(op, m):
    return [dataclasses.replace(S(m.f(5, 3), 0.5, True), random=True, seed=7), S(m.f(5, 3), 0.0, False)]


@_on(aten._local_scalar_dense.default)
def _item(op, m):
    return [S(m.f()), S(m.i()), S(m.f(1))]


# --- matmul -----------------------------------------------------------------------------------------

@_on(aten.mm.default)
def _mm(op, m):
    return [S(m.f(5, 3), m.f(3, 4)), S(m.f(2, 5), m.f(5, 3))]


@_on(aten.bmm.default)
def _bmm(op, m):
    return [S(m.f(3, 5, 2), m.f(3, 2, 4)), S(m.f(2, 3, 5), m.f(2, 5, 1))]


@_on(aten.dot.default)
def _dot(op, m):
    return [S(m.f(5), m.f(5)), S(m.f(2), m.f(2))]


@_on(aten.mv.default)
def _mv(op, m):
    return [S(m.f(5, 3), m.f(3)), S(m.f(2, 5), m.f(5))]


@_on(aten.addmm.default)
def _addmm(op, m):
    return [S(m.f(4), m.f(5, 3), m.f(3, 4)), S(m.f(5, 4), m.f(5, 3), m.f(3, 4), beta=0.5, alpha=2.0),
            S(m.f(5, 1), m.f(5, 3), m.f(3, 4)), S(m.f(1, 3), m.f(2, 5), m.f(5, 3))]


@_on(aten.baddbmm.default)
def _baddbmm(op, m):
    return [S(m.f(3, 5, 4), m.f(3, 5, 2), m.f(3, 2, 4)), S(m.f(4), m.f(3, 5, 2), m.f(3, 2, 4), beta=0.5, alpha=2.0)]


# --- views ------------------------------------------------------------------------------------------

_VIEW_PAIRS = [((5, 6), [30]), ((6, 5), [3, 10]), ((30,), [5, 6]), ((4, 6), [2, 2, 6]), ((2, 3, 4), [6, -1]),
               ((1, 5, 6), [5, 6]), ((5, 6, 1), [30]), ((8, 3), [4, 6]), ((3, 4), [3, 1, 4]), ((2, 1), [2])]


@_on(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(op, m):
    return [S(m.f(*a), b) for a, b in _VIEW_PAIRS]


@_on(aten.t.default, aten.transpose.int, aten.permute.default)
def _permute(op, m):
    if op is aten.t.default:
        return [S(m.f(5, 3)), S(m.f(3))]
    if op is aten.transpose.int:
        return [S(m.f(2, 3, 5), 0, 2), S(m.f(5, 3), -1, 0)]
    return [S(m.f(2, 3, 5), [2, 0, 1]), S(m.f(2, 3, 5), [-1, 0, 1])]


@_on(aten.unsqueeze.default)
def _unsqueeze(op, m):
    return [S(m.f(5, 3), 1), S(m.f(5, 3), -1), S(m.f(3), 0), S(m.f(), 0)]


@_on(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(op, m):
    if op is aten.squeeze.default:
        return [S(m.f(5, 1, 3)), S(m.f(2, 1)), S(m.f(5, 3))]
    if op is aten.squeeze.dim:
        return [S(m.f(5, 1, 3), 1), S(m.f(5, 3), 0), S(m.f(3, 1), -1), S(m.f(2, 3), 0)]
    return [S(m.f(1, 5, 1, 3), [0, 2]), S(m.f(5, 3), [0, 1]), S(m.f(2, 1), [-1, 0])]


@_on(aten.expand.default)
def _expand(op, m):
    return [S(m.f(5, 1), [5, 4]), S(m.f(3), [2, 3]), S(m.f(1, 3), [4, -1]), S(m.f(2, 1), [3, 2, 5])]


@_on(aten.slice.Tensor)
def _slice(op, m):
    return [S(m.f(6, 5), 1, 1, 4), S(m.f(6, 5), 0, 0, 5, 2), S(m.f(7, 3), 0, 2, sys.maxsize), S(m.f(6, 5), 1, -3),
            S(m.f(5, 3), -1, 0, 2)]


@_on(aten.select.int)
def _select(op, m):
    return [S(m.f(6, 5), 1, 2), S(m.f(6, 5), 0, -1), S(m.f(3), 0, 1), S(m.f(2, 3, 5), -2, 0)]


@_on(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
def _split(op, m):
    if op is aten.split.Tensor:
        return [S(m.f(7, 5), 3), S(m.f(7, 5), 2, 1), S(m.f(3, 5), 1, -2)]
    if op is aten.split_with_sizes.default:
        return [S(m.f(7, 5), [2, 5]), S(m.f(7, 5), [1, 1, 3], 1)]
    return [S(m.f(3, 5)), S(m.f(3, 5), 1), S(m.f(2, 3, 5), -1)]


@_on(aten.cat.default, aten.stack.default)
def _cat(op, m):
    if op is aten.stack.default:
        return [S([m.f(5, 3), m.f(5, 3)]), S([m.f(5, 3), m.f(5, 3), m.f(5, 3)], 1), S([m.f(5, 3), m.f(5, 3)], -1),
                S([m.f(3), m.f(3)], 0)]
    return [S([m.f(3, 5), m.f(2, 5)]), S([m.f(5, 3), m.f(5, 2)], 1), S([m.f(3, 5), m.f(0)], 0),
            S([m.f(5, 3), m.f(5, 3)], -1), S([m.f(3), m.f(2)])]


@_on(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default)
def _new(op, m):
    extra = (2.5,) if op is aten.new_full.default else ()
    out = [S(m.f(5, 3), [4, 3], *extra), S(m.f(2), [2, 5], *extra), S(m.i(3), [3], *extra, dtype=torch.float64)]
    return [dataclasses.replace(s, undefined=op is aten.new_empty.default) for s in out]


# --- reductions ---------------------------------------------------------------------------------------

@_on(aten.sum.default, aten.mean.default)
def _reduce_all(op, m):
    out = [S(m.f(5, 3)), S(m.f(4, 6)), S(m.f(2))]
    return out + ([S(m.i(5, 3))] if op is aten.sum.default else [])


@_on(aten.sum.dim_IntList, aten.mean.dim)
def _reduce_dims(op, m):
    out = [S(m.f(5, 3), [1]), S(m.f(5, 3), [0], True), S(m.f(2, 3, 4), [-1, 0]), S(m.f(4, 6), [0, 1], True),
           S(m.f(4, 3), [0]), S(m.f(5, 3), [0], dtype=torch.float64)]
    return out + ([S(m.f(5, 3), []), S(m.i(5, 3), [0])] if op is aten.sum.dim_IntList else [])


@_on(aten.amax.default, aten.amin.default)
def _minmax(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), [1], True), S(m.f(5, 3), [0]), S(m.fi(4, 6), [0, 1]), S(m.i(5, 3), [-1]),
            S(m.f(8, 3), [0])]


# --- nn ---------------------------------------------------------------------------------------------

@_on(aten._softmax.default, aten._log_softmax.default)
def _softmax(op, m):
    return [S(m.f(5, 3), 1, False), S(m.f(2, 3, 5), 0, False), S(m.f(5, 3), -2, False)]


@_on(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_backward(op, m):
    fwd = aten._softmax if op is aten._softmax_backward_data.default else aten._log_softmax
    out = []
    for shape, dim in (((5, 3), 1), ((2, 3, 5), 0)):
        y = fwd.default(m.f(*shape), dim, False)
        out.append(S(m.f(*shape), y, dim, torch.float32))
    return out


def _nll_inputs(m, batch: int, classes: int = 4):
    x = torch.log_softmax(m.f(batch, classes), 1)
    target = m.i(batch, hi=classes)
    target[0] = -100 if batch > 1 else target[0]  # an ignored row
    return x, target, m.pos(classes)


@_on(aten.nll_loss_forward.default)
def _nll(op, m):
    out = []
    for reduction in (0, 1, 2):
        x, t, w = _nll_inputs(m, 5)
        out += [S(x, t, None, reduction, -100), S(x, t, w, reduction, -100)]
    x, t, w = _nll_inputs(m, 2)
    out.append(S(x, t, w, 2, -100))
    out.append(S(torch.log_softmax(m.f(4), 0), m.i(hi=4), None, 1, -100))
    return out


@_on(aten.nll_loss_backward.default)
def _nll_backward(op, m):
    out = []
    for reduction, w_on in ((0, True), (1, True), (1, False), (2, True)):
        x, t, w = _nll_inputs(m, 5)
        w = w if w_on else None
        _, total = aten.nll_loss_forward.default(x, t, w, reduction, -100)
        g = m.f(5) if reduction == 0 else m.f()
        out.append(S(g, x, t, w, reduction, -100, total))
    return out


@_on(aten.native_layer_norm.default)
def _layer_norm(op, m):
    return [S(m.f(5, 3, 4), [4], m.f(4), m.f(4), 1e-5), S(m.f(5, 3, 4), [3, 4], m.f(3, 4), None, 1e-5),
            S(m.f(2, 6), [6], None, None, 1e-5)]


@_on(aten.native_layer_norm_backward.default)
def _layer_norm_backward(op, m):
    out = []
    for shape, norm, affine, mask in (((5, 3, 4), [4], True, [True, True, True]),
                                      ((2, 6), [6], True, [True, False, True]),
                                      ((5, 3, 4), [3, 4], False, [True, False, False])):
        x = m.f(*shape)
        w, b = (m.f(*norm), m.f(*norm)) if affine else (None, None)
        _, mean, rstd = aten.native_layer_norm.default(x, norm, w, b, 1e-5)
        out.append(S(m.f(*shape), x, norm, mean, rstd, w, b, mask))
    return out


# the embedding, foreach and norm samples register themselves into _BUILDERS
from . import _samples_more  # noqa: E402,F401
