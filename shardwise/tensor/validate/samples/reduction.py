"""Validator samples for ``ops/reduction.py``: sum/mean over all or some dims, amax/amin."""

from __future__ import annotations

import torch
from torch.ops import aten

from .base import S, _on


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
