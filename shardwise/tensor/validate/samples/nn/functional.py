"""Validator samples for ``ops/nn/functional.py``: softmax, nll_loss and layer_norm, forward and backward."""

from __future__ import annotations

import torch
from torch.ops import aten

from ..base import S, _on


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
