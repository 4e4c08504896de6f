"""Optimizers fused into backward: sparse row updates on local shards.

Each rule applies exactly its torch class's update to the rows a batch touched (rows that were not
touched keep their weights and state, as with sparse gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

STATE_DTYPE = torch.float32    # optimizer state and the update's arithmetic, whatever the weights' dtype

from ...optim.rowwise_adagrad import RowWiseAdagrad
from .occurrence_sgd import OccurrenceSGD
from .row_update import RowUpdate

__all__ = ["RowWiseAdagrad", "FusedRule", "resolve_optimizer"]


# Rows are unique, so gather (index_select) -> compute in place -> write back (index_copy_) is exact;
# those row ops are several times faster on CPU than advanced indexing (t[rows], t[rows] = x) and
# than index_add_, which CPU runs as one small add per row.

def _add_rows(t: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor, alpha: float) -> None:
    """t[rows] += alpha * delta for unique rows (the same arithmetic as index_add_)."""
    t.index_copy_(0, rows, t.index_select(0, rows).add_(delta, alpha=alpha))


def sgd_update(weight, state, rows, grad, hp):
    _add_rows(weight, rows, grad, -hp["lr"])


def adagrad_update(weight, state, rows, grad, hp):
    clr = hp["lr"] / (1 + (state["step"] - 1) * hp["lr_decay"])
    acc = state["sum"].index_select(0, rows).addcmul_(grad, grad, value=1)
    state["sum"].index_copy_(0, rows, acc)
    std = acc.sqrt_().add_(hp["eps"])
    _add_rows(weight, rows, grad.div(std), -clr)


def adam_update(weight, state, rows, grad, hp):
    step = state["step"]
    beta1, beta2 = hp["betas"]
    m = state["exp_avg"].index_select(0, rows).lerp_(grad, 1 - beta1)
    v = state["exp_avg_sq"].index_select(0, rows).mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    state["exp_avg"].index_copy_(0, rows, m)
    state["exp_avg_sq"].index_copy_(0, rows, v)
    step_size = hp["lr"] / (1 - beta1 ** step)
    denom = v.sqrt_().div_(math.sqrt(1 - beta2 ** step)).add_(hp["eps"])
    _add_rows(weight, rows, m.div_(denom), -step_size)


def adamw_update(weight, state, rows, grad, hp):
    # torch.optim.AdamW's decoupled decay, on the touched rows only (as FBGEMM's fused AdamW does)
    weight.index_copy_(0, rows, weight.index_select(0, rows).mul_(1 - hp["lr"] * hp["weight_decay"]))
    adam_update(weight, state, rows, grad, hp)


def row_wise_adagrad_update(weight, state, rows, grad, hp):
    acc = state["sum"].index_select(0, rows) + (grad * grad).mean(dim=1)
    state["sum"].index_copy_(0, rows, acc)
    std = acc.sqrt_().add_(hp["eps"])
    _add_rows(weight, rows, grad / std.unsqueeze(1), -hp["lr"])


# Tensor-only kernels for torch.compile: coefficients arrive as one tensor so that a changing step
# (Adam's bias correction) does not recompile. Inductor fuses gather, math and scatter into one loop.
# The last coefficient scales the gradient (gradient division) inside that loop: a separate pass
# would read and write every touched row once more (about a tenth of a table-wise step).

def sgd_kernel(weight, rows, grad, c):
    grad = grad * c[-1]
    weight.index_add_(0, rows, (grad * -c[0]).to(weight.dtype))


# Adagrad's accumulator is added in place first and read back: inductor then makes two in-place
# loops over the touched rows and no temporary (a gather into a temporary and a scatter back made a
# 2 MiB temporary per block, fresh pages every call). Rows are unique, so this is the same
# arithmetic bit for bit.

def adagrad_kernel(weight, acc_state, rows, grad, c):
    grad = grad * c[-1]
    acc_state.index_add_(0, rows, grad * grad)
    acc = acc_state.index_select(0, rows)
    weight.index_add_(0, rows, (grad / (acc.sqrt() + c[1]) * -c[0]).to(weight.dtype))


def _adam_step(m_state, v_state, rows, grad, c):
    """Both moments of the touched rows updated in place; returns the step before the learning rate."""
    grad = grad * c[-1]
    m = m_state.index_select(0, rows) * c[0] + grad * (1 - c[0])
    v = v_state.index_select(0, rows) * c[1] + grad * grad * (1 - c[1])
    m_state.index_copy_(0, rows, m)
    v_state.index_copy_(0, rows, v)
    return m / (v.sqrt() / c[3] + c[4])


def adam_kernel(weight, m_state, v_state, rows, grad, c):
    weight.index_add_(0, rows, (_adam_step(m_state, v_state, rows, grad, c) * -c[2]).to(weight.dtype))


def adamw_kernel(weight, m_state, v_state, rows, grad, c):
    step = _adam_step(m_state, v_state, rows, grad, c)
    decayed = weight.index_select(0, rows) * c[5]
    weight.index_copy_(0, rows, (decayed - step * c[2]).to(weight.dtype))


def row_wise_adagrad_kernel(weight, acc_state, rows, grad, c):
    grad = grad * c[-1]
    acc_state.index_add_(0, rows, (grad * grad).mean(dim=1))
    acc = acc_state.index_select(0, rows)
    weight.index_add_(0, rows, (grad / (acc.sqrt() + c[1]).unsqueeze(1) * -c[0]).to(weight.dtype))


def _adagrad_coeffs(hp, step):
    return [hp["lr"] / (1 + (step - 1) * hp["lr_decay"]), hp["eps"]]


def _adam_coeffs(hp, step):
    beta1, beta2 = hp["betas"]
    return [beta1, beta2, hp["lr"] / (1 - beta1 ** step), math.sqrt(1 - beta2 ** step), hp["eps"]]


def _adamw_coeffs(hp, step):
    return _adam_coeffs(hp, step) + [1 - hp["lr"] * hp["weight_decay"]]


@dataclass(frozen=True)
class FusedRule:
    """A supported optimizer: its update (a :class:`RowUpdate`: the compiled one-pass kernel on
    large calls, the eager update on small ones), its compilable kernel with the kernel's
    coefficients, its per-row state (name -> "elem" same shape as weight | "row" one per row), and
    the hyper-parameter values it cannot honour on touched rows only."""

    name: str
    update: Callable
    state_shapes: dict
    init_values: Callable       # hp -> {state name: initial fill value}
    forbidden: dict             # hp name -> the only accepted value
    kernel: Callable            # (weight, *state, rows, grad, coeffs + [grad scale])
    coeffs: Callable            # (hp, step) -> list of floats for the kernel (the caller appends the scale)
    row_state: bool = False
    # SGD only: its update straight from a pooled lookup's occurrences (no grouping by row)
    occurrence: Optional[OccurrenceSGD] = None


def _rule(name, eager, state_shapes, init_values, forbidden, kernel, coeffs, row_state=False,
          occurrence=None, native=None) -> FusedRule:
    update = RowUpdate(eager, kernel, coeffs, state_shapes, native=native)
    return FusedRule(name, update, state_shapes, init_values, forbidden, kernel, coeffs, row_state, occurrence)


_RULES = {
    torch.optim.SGD: _rule(
        "SGD", sgd_update, {}, lambda hp: {},
        {"momentum": 0, "weight_decay": 0, "maximize": False, "nesterov": False},
        sgd_kernel, lambda hp, step: [hp["lr"]], occurrence=OccurrenceSGD(), native="sgd"),
    torch.optim.Adagrad: _rule(
        "Adagrad", adagrad_update, {"sum": "elem"}, lambda hp: {"sum": hp["initial_accumulator_value"]},
        {"weight_decay": 0, "maximize": False}, adagrad_kernel, _adagrad_coeffs, native="adagrad"),
    torch.optim.Adam: _rule(
        "Adam", adam_update, {"exp_avg": "elem", "exp_avg_sq": "elem"},
        lambda hp: {"exp_avg": 0.0, "exp_avg_sq": 0.0},
        {"weight_decay": 0, "maximize": False, "amsgrad": False}, adam_kernel, _adam_coeffs, native="adam"),
    torch.optim.AdamW: _rule(
        "AdamW", adamw_update, {"exp_avg": "elem", "exp_avg_sq": "elem"},
        lambda hp: {"exp_avg": 0.0, "exp_avg_sq": 0.0},
        {"maximize": False, "amsgrad": False}, adamw_kernel, _adamw_coeffs, native="adamw"),
    RowWiseAdagrad: _rule(
        "RowWiseAdagrad", row_wise_adagrad_update, {"sum": "row"},
        lambda hp: {"sum": hp["initial_accumulator_value"]}, {}, row_wise_adagrad_kernel,
        lambda hp, step: [hp["lr"], hp["eps"]], row_state=True),
}


def resolve_optimizer(optimizer) -> tuple[FusedRule, dict]:
    """Turn ``functools.partial(torch.optim.Adagrad, lr=0.1)`` (or a bare class) into (rule, hyper-params).

    The class is instantiated once on a dummy parameter so its own defaults fill the hyper-parameters.
    """
    if optimizer is None:
        raise ValueError("optimizer is None")
    try:
        probe = optimizer([torch.nn.Parameter(torch.zeros(1, 1))])
    except Exception as exc:
        raise TypeError(f"optimizer={optimizer!r} must be a torch optimizer class or a functools.partial of "
                        f"one, e.g. functools.partial(torch.optim.Adagrad, lr=0.1) ({exc})") from exc
    rule = _RULES.get(type(probe))
    if rule is None:
        names = ", ".join(r.name for r in _RULES.values())
        raise ValueError(f"optimizer {type(probe).__name__} cannot be fused into the embedding backward; "
                         f"supported: {names}")
    hp = {k: v for k, v in probe.param_groups[0].items() if k != "params"}
    for key, only in rule.forbidden.items():
        if key in hp and hp[key] is not None and hp[key] != only:
            raise ValueError(f"{rule.name}({key}={hp[key]!r}) is not supported fused: the sparse update touches "
                             f"only the rows in a batch, so {key} would diverge from dense {rule.name}; "
                             f"use {key}={only!r}")
    hp["lr"] = float(hp["lr"])
    return rule, hp
