"""Validator samples for ``ops/numeric/matmul.py``: mm, bmm, dot, mv, addmm, baddbmm."""

from __future__ import annotations

from torch.ops import aten

from ..base import S, _on


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
