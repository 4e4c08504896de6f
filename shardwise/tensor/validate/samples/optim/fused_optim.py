"""Validator samples for ``ops/optim/fused_optim.py``: one fused optimizer step over three parameters of
uneven shapes, with their gradients and state (0-d state steps; grad_scale and lr also plain, as torch.optim passes them)."""

from __future__ import annotations

import torch
from torch.ops import aten

from ..base import Plain, S, _on

_SHAPES = [(5, 3), (2,), (3, 1)]


def _like(m, pos=False):
    return [m.pos(*s) if pos else m.f(*s) for s in _SHAPES]


def _steps(value=3.0):
    return [torch.tensor(value) for _ in _SHAPES]  # 0-d: replicated (a pending step is refused)


@_on(aten._fused_adam_.default, aten._fused_adamw_.default)
def _adam(op, m):
    kw = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8, maximize=False)
    return [S(_like(m), _like(m), _like(m), _like(m, True), [], _steps(), amsgrad=False, **kw),
            S(_like(m), _like(m), _like(m), _like(m, True), _like(m, True), _steps(), amsgrad=True,
              grad_scale=Plain(torch.tensor(2.0)), found_inf=Plain(torch.tensor(0.0)), **kw)]


@_on(aten._fused_adam_.tensor_lr, aten._fused_adamw_.tensor_lr)
def _adam_tensor_lr(op, m):
    return [S(_like(m), _like(m), _like(m), _like(m, True), [], _steps(), lr=Plain(torch.tensor(0.1)), beta1=0.9,
              beta2=0.99, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=True)]


@_on(aten._fused_sgd_.default)
def _sgd(op, m):
    kw = dict(weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.1, maximize=False)
    return [S(_like(m), _like(m), _like(m), nesterov=True, is_first_step=False, **kw),
            S(_like(m), _like(m), _like(m), nesterov=False, is_first_step=True, grad_scale=Plain(torch.tensor(2.0)),
              **kw)]


@_on(aten._fused_sgd_.tensor_lr)
def _sgd_tensor_lr(op, m):
    return [S(_like(m), _like(m), _like(m), weight_decay=0.0, momentum=0.5, lr=Plain(torch.tensor(0.1)),
              dampening=0.0, nesterov=False, maximize=False, is_first_step=False)]


@_on(aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr)
def _adagrad(op, m):
    lr = 0.1 if op is aten._fused_adagrad_.default else Plain(torch.tensor(0.1))
    return [S(_like(m), _like(m), _like(m, True), _steps(), lr=lr, lr_decay=0.01, weight_decay=0.1, eps=1e-10,
              maximize=False)]
