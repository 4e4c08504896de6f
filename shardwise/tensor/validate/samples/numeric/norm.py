"""Validator samples for ``ops/numeric/norm.py``: vector norms and ``_foreach_norm`` (sharded reductions run a
collective kernel, so they are also checked on thread ranks)."""

from __future__ import annotations

from torch.ops import aten

from ..base import S, _on


@_on(aten.linalg_vector_norm.default)
def _vector_norm(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), 1.0, [0]), S(m.f(5, 3), float("inf"), [1], True), S(m.f(2, 7), 3.0),
            S(m.f(4, 3), 0.0), S(m.f(3, 5), -float("inf"), [0])]


@_on(aten._foreach_norm.Scalar)
def _foreach_norm(op, m):
    return [S([m.f(5, 3), m.f(2), m.f(3, 1)], 2.0), S([m.f(5, 3), m.f(4)], float("inf"))]
