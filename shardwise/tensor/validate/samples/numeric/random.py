"""Validator samples for ``ops/numeric/random.py``: every call reseeds the RNG, so a sharded result must be
the slice of the unsharded draw (uneven and empty shards included), a replicated one the whole of it."""

from __future__ import annotations

import dataclasses

from torch.ops import aten

from ..base import S, _on


def _random(*samples):
    return [dataclasses.replace(s, random=True, seed=7 + i) for i, s in enumerate(samples)]


_SCALARS = {
    aten.uniform_.default: (-1.0, 2.0), aten.normal_.default: (0.5, 2.0), aten.bernoulli_.float: (0.3,),
    aten.log_normal_.default: (), aten.exponential_.default: (2.0,), aten.geometric_.default: (0.4,),
    aten.cauchy_.default: (), aten.random_.default: (), getattr(aten.random_, "from"): (-3, 9),
    aten.random_.to: (5,), aten.bernoulli.p: (0.6,), aten.rand_like.default: (),
    aten.randn_like.default: (), aten.randint_like.default: (7,), aten.randint_like.low_dtype: (-2, 4),
}


@_on(*_SCALARS)
def _draw(op, m):
    extra = _SCALARS[op]
    return _random(S(m.f(5, 3), *extra), S(m.f(2), *extra), S(m.f(3, 4, 2), *extra))


@_on(aten.native_dropout.default)
def _dropout(op, m):
    return _random(S(m.f(5, 3), 0.5, True), S(m.f(3, 4, 2), 0.25, None), S(m.f(5, 3), 0.0, False))


@_on(aten.bernoulli.default, aten.bernoulli_.Tensor)
def _bernoulli_values(op, m):
    if op is aten.bernoulli.default:
        return _random(S(m.pos(5, 3) - 0.5), S(m.pos(2) - 0.5))
    return _random(S(m.f(5, 3), m.pos(5, 3) - 0.5))
