"""Validator samples for ``ops/shape/view.py``: views, reshapes, slicing, split/cat, ``new_*`` factories."""

from __future__ import annotations

import dataclasses
import sys

import torch
from torch.ops import aten

from ..base import S, _on


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


@_on(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default,
     aten.new_empty_strided.default)
def _new(op, m):
    if op is aten.new_empty_strided.default:
        out = [S(m.f(5, 3), [4, 3], [1, 4]), S(m.i(3), [2, 5], [5, 1])]
        return [dataclasses.replace(s, undefined=True) for s in out]
    extra = (2.5,) if op is aten.new_full.default else ()
    out = [S(m.f(5, 3), [4, 3], *extra), S(m.f(2), [2, 5], *extra), S(m.i(3), [3], *extra, dtype=torch.float64)]
    return [dataclasses.replace(s, undefined=op is aten.new_empty.default) for s in out]


# gradients of slicing, scattered into zeros

@_on(aten.slice_backward.default)
def _slice_backward(op, m):
    return [S(m.f(6, 3), [6, 5], 1, 1, 4, 1), S(m.f(3, 5), [6, 5], 0, 0, 5, 2), S(m.f(5, 2), [7, 2], 0, 2, 7, 1)]


@_on(aten.select_backward.default)
def _select_backward(op, m):
    return [S(m.f(5), [6, 5], 0, 2), S(m.f(7), [7, 3], 1, -1)]
