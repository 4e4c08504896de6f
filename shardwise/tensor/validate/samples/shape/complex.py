"""Validator samples for ``ops/shape/complex.py``: view_as_complex / view_as_real, the lazy conj/neg views, and
the ``*_copy`` forms ops/copies.py derives from them."""

from __future__ import annotations

import torch
from torch.ops import aten

from ..base import S, _on


@_on(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def _view_as_complex(op, m):
    return [S(m.f(5, 3, 2)), S(m.f(2, 7, 3, 2)), S(m.f(3, 2))]


@_on(aten.view_as_real.default, aten.view_as_real_copy.default)
def _view_as_real(op, m):
    return [S(torch.complex(m.f(5, 3), m.f(5, 3))), S(torch.complex(m.f(2, 7, 3), m.f(2, 7, 3)))]


@_on(aten._conj.default, aten._conj_copy.default, aten.resolve_conj.default, aten._neg_view.default,
     aten.resolve_neg.default)
def _conj_views(op, m):
    z = torch.complex(m.f(5, 3), m.f(5, 3))
    if op is aten.resolve_conj.default:
        z = z.conj()
    elif op is aten.resolve_neg.default:
        z = aten._neg_view.default(z)
    return [S(z), S(torch.complex(m.f(2, 7), m.f(2, 7)))]
