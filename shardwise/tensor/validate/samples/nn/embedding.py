"""Validator samples for ``ops/nn/embedding.py``: lookups on row-wise tables (ids spread over every rank's
row block), the dense backward and max-norm renorm."""

from __future__ import annotations

from torch.ops import aten

from ..base import S, _on


@_on(aten.embedding.default)
def _embedding(op, m):
    return [S(m.f(10, 4), m.i(5, 3, hi=10)), S(m.f(3, 5), m.i(7, hi=3)), S(m.f(10, 4), m.i(5, hi=10), 2),
            S(m.f(10, 4), m.i(2, 3, hi=10), scale_grad_by_freq=True)]


@_on(aten.embedding_dense_backward.default)
def _embedding_backward(op, m):
    return [S(m.f(5, 3, 4), m.i(5, 3, hi=10), 10, -1, False), S(m.f(7, 5), m.i(7, hi=3), 3, 1, False),
            S(m.f(5, 3, 4), m.i(5, 3, hi=10), 10, 2, True)]


@_on(aten.embedding_renorm_.default)
def _embedding_renorm(op, m):
    return [S(m.f(10, 4) * 3, m.i(6, hi=10), 1.0, 2.0), S(m.f(3, 5) * 3, m.i(4, hi=3), 0.5, 1.0)]
