"""Functional SGD / Adam / AdamW, traced into the step graph.

``torch.optim`` reads Python-float hyper-parameters and lazily creates state,
which a replayed graph cannot follow.  Here the update is a function of
``(params, grads, states, lr)`` with the state passed explicitly; the
learning rate and the step count are tensor *inputs* (so a scheduler changes
them without a new trace), every other hyper-parameter is a traced-in
constant guarded by :class:`OptimSpec`.  Like torch, it updates parameters
and state in place, so a step allocates no new full-size buffers.

Two implementations, picked per param group by its ``fused`` option:

* ``fused=None`` (torch's default) or ``True``: torch's fused kernel (``torch._fused_adam_`` and
  friends), one call for a whole list of parameters, on devices that have it (CPU, CUDA); the numbers
  are those of ``torch.optim.Adam(..., fused=True)`` (within float rounding of the for-loop
  implementation: one ulp per step, as between torch's own implementations).
* ``fused=False``: per-parameter ops following torch's single-tensor implementation (the one eager
  ``torch.optim`` runs on CPU by default), for bit-level agreement with it at the cost of ~10 kernels
  per parameter.

Example::

    spec = optim_spec(torch.optim.Adam(model.parameters(), lr=1e-3))
    new_p, new_s = functional_update(spec.groups[0], [p], [g], [state])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["GroupSpec", "OptimSpec", "optim_spec", "state_names", "functional_update"]

_KINDS = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}
# Hyper-parameters we implement; anything else set to a non-default value is rejected.
_SUPPORTED = {
    "sgd": {"momentum", "dampening", "weight_decay", "nesterov", "maximize"},
    "adam": {"betas", "eps", "weight_decay", "maximize"},
    "adamw": {"betas", "eps", "weight_decay", "maximize"},
}
# Options that only pick an implementation (same numerics) and can be ignored.
_IGNORED = {"foreach", "capturable", "params", "lr", "initial_lr", "decoupled_weight_decay", "fused"}
_MUST_BE_FALSY = {"differentiable", "amsgrad"}
_FUSED_DEVICES = ("cpu", "cuda")  # where torch has the fused kernels for all three optimizers


@dataclass(frozen=True)
class GroupSpec:
    """Traced-in (guarded) hyper-parameters of one param group; ``lr`` is excluded."""

    kind: str
    hparams: tuple[tuple[str, Any], ...]
    fused: bool = False  # run torch's fused kernel where the device has one (see the module docstring)

    def get(self, name: str) -> Any:
        return dict(self.hparams)[name]


@dataclass(frozen=True)
class OptimSpec:
    kind: str
    groups: tuple[GroupSpec, ...]


def optim_spec(optimizer: Any) -> OptimSpec:
    """Validate ``optimizer`` and describe it; raises before anything is mutated."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}; "
            "pass the optimizer as the second argument of the step: step(model, optimizer, *batch)"
        )
    kind = _KINDS.get(type(optimizer))
    if kind is None:
        raise TypeError(
            f"unsupported optimizer {type(optimizer).__name__}: shardwise.compile traces only "
            "torch.optim.SGD, torch.optim.Adam and torch.optim.AdamW; use one of those"
        )
    groups = []
    for i, group in enumerate(optimizer.param_groups):
        for name in _MUST_BE_FALSY:
            if group.get(name):
                raise ValueError(
                    f"{type(optimizer).__name__} param_groups[{i}] has {name}={group[name]!r}; "
                    f"{name} optimizers cannot be traced into the step graph; "
                    f"construct the optimizer with {name}=False"
                )
        for name in group:
            if name not in _SUPPORTED[kind] | _IGNORED | _MUST_BE_FALSY:
                raise ValueError(
                    f"{type(optimizer).__name__} option {name!r}={group[name]!r} is not supported "
                    f"by shardwise.compile; supported options: {sorted(_SUPPORTED[kind])}"
                )
        if kind == "sgd" and group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("SGD nesterov=True needs momentum > 0 and dampening == 0")
        if isinstance(group["lr"], torch.Tensor) or not isinstance(group["lr"], (int, float)):
            raise TypeError(f"param_groups[{i}]['lr'] must be a Python float, got {group['lr']!r}; set it with "
                            "float(lr) (the compiled step reads lr on every call, so schedulers need no tensor lr)")
        hp = tuple(sorted((k, _freeze(group[k])) for k in _SUPPORTED[kind] if k in group))
        groups.append(GroupSpec(kind, hp, fused=group.get("fused") is not False))
    return OptimSpec(kind, tuple(groups))


def _freeze(v: Any) -> Any:
    return tuple(v) if isinstance(v, (list, tuple)) else v


def state_names(group: GroupSpec, has_state: bool) -> tuple[str, ...]:
    """Names of per-parameter state tensors (torch's own keys, for checkpoints)."""
    if group.kind == "sgd":
        # torch creates the momentum buffer lazily on the first step; the
        # first step is traced without it (the guard includes `has_state`).
        return ("momentum_buffer",) if group.get("momentum") != 0 and has_state else ()
    return ("step", "exp_avg", "exp_avg_sq")


def functional_update(group: GroupSpec, params, grads, states, lr: torch.Tensor, grad_scale: int | None = None):
    """Return ``(new_params, new_states)``; ``states[i]`` maps name -> tensor.

    ``grad_scale``: the gradients are ``grad_scale`` times the ones to apply (sums over data-parallel
    ranks): the fused kernel divides while it reads them, the per-parameter path divides first.

    Parameters and existing state are updated in place (as torch does: no
    fresh full-size buffers per step) and returned; only lazily created
    state (SGD's first momentum buffer) is new.  ``lr`` is a 0-dim float64
    tensor so the update sees the same value as torch's Python-float math.
    In a graph these in-place ops come after every read of the parameter.
    """
    if group.fused and _fusable(params, grads):
        return _fused_update(group, params, grads, states, lr, grad_scale)
    if grad_scale is not None:
        grads = [None if g is None else g.div(grad_scale) for g in grads]
    fn = _sgd if group.kind == "sgd" else _adam
    new_p, new_s = [], []
    for p, g, s in zip(params, grads, states):
        if g is None:
            new_p.append(p)
            new_s.append(dict(s))
            continue
        if group.get("maximize"):
            g = -g
        np_, ns = fn(group, p, g, s, lr)
        new_p.append(np_)
        new_s.append(ns)
    return new_p, new_s


def _sgd(group: GroupSpec, p, g, s, lr):
    wd, mom = group.get("weight_decay"), group.get("momentum")
    if wd != 0:
        g = g.add(p, alpha=wd)
    new_s = {}
    if mom != 0:
        buf = s.get("momentum_buffer")
        if buf is None:
            buf = g.clone()
        else:
            buf.mul_(mom).add_(g, alpha=1 - group.get("dampening"))
        new_s["momentum_buffer"] = buf
        g = g.add(buf, alpha=mom) if group.get("nesterov") else buf
    # p + g * (-lr): torch's add_(g, alpha=-lr) with the rate as a tensor
    return p.addcmul_(g, (-lr).to(p.dtype)), new_s


def _adam(group: GroupSpec, p, g, s, lr):
    beta1, beta2 = group.get("betas")
    eps, wd = group.get("eps"), group.get("weight_decay")
    step = s["step"].add_(1)
    if wd != 0:
        if group.kind == "adamw":
            p.mul_((1 - lr * wd).to(p.dtype))
        else:
            g = g.add(p, alpha=wd)
    m = s["exp_avg"].lerp_(g, 1 - beta1)
    v = s["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
    # Bias corrections in float64, as torch computes them on Python floats.
    step64 = step.to(torch.float64)
    bc1 = 1 - torch.pow(beta1, step64)
    bc2_sqrt = torch.sqrt(1 - torch.pow(beta2, step64))
    neg_step_size = (-lr / bc1).to(p.dtype)
    denom = v.sqrt().div_(bc2_sqrt.to(p.dtype)).add_(eps)
    p.addcmul_(torch.div(m, denom, out=denom), neg_step_size)
    return p, {"step": step, "exp_avg": m, "exp_avg_sq": v}


def _fusable(params, grads) -> bool:
    live = [(p, g) for p, g in zip(params, grads) if g is not None]
    return bool(live) and all(
        p.device.type in _FUSED_DEVICES and p.is_floating_point() and g.dtype == p.dtype and g.device == p.device
        for p, g in live
    )


def _fused_update(group: GroupSpec, params, grads, states, lr, grad_scale: int | None):
    """One fused-kernel call for every parameter with a gradient (torch's ``fused=True`` path)."""
    live = [i for i, g in enumerate(grads) if g is not None]
    ps, gs = [params[i] for i in live], [grads[i] for i in live]
    if ps[0].device.type != "cpu":
        lr = lr.to(torch.float32)  # the CUDA kernels read a float32 rate
    # the kernels' loss-scale input divides each gradient as it is read (exactly a division: no extra pass)
    scale = None if grad_scale is None else torch.full((), float(grad_scale), dtype=torch.float32, device=ps[0].device)
    new_s = [dict(s) for s in states]
    if group.kind == "sgd":
        mom = group.get("momentum")
        bufs, first = [], False
        if mom != 0:
            first = any(states[i].get("momentum_buffer") is None for i in live)
            # the kernel copies the gradient into a new buffer on the first step, as torch does
            bufs = [torch.empty_like(g) if first else states[i]["momentum_buffer"] for i, g in zip(live, gs)]
            for i, b in zip(live, bufs):
                new_s[i]["momentum_buffer"] = b
        torch._fused_sgd_(
            ps, gs, bufs, weight_decay=group.get("weight_decay"), momentum=mom, lr=lr,
            dampening=group.get("dampening"), nesterov=group.get("nesterov"), maximize=group.get("maximize"),
            is_first_step=first, grad_scale=scale,
        )
        return list(params), new_s
    steps = [states[i]["step"] for i in live]
    for st in steps:  # torch increments the counts before the kernel reads them
        st.add_(1)
    kernel = torch._fused_adamw_ if group.kind == "adamw" else torch._fused_adam_
    beta1, beta2 = group.get("betas")
    kernel(
        ps, gs, [states[i]["exp_avg"] for i in live], [states[i]["exp_avg_sq"] for i in live], [], steps,
        lr=lr, beta1=beta1, beta2=beta2, weight_decay=group.get("weight_decay"), eps=group.get("eps"),
        amsgrad=False, maximize=group.get("maximize"), grad_scale=scale,
    )
    return list(params), new_s


def init_state(group: GroupSpec, shard: torch.Tensor, has_state: bool) -> dict[str, torch.Tensor]:
    """Fresh state for one (possibly sharded) parameter, on its device."""
    names = state_names(group, has_state)
    out = {}
    for n in names:
        if n == "step":
            out[n] = torch.zeros((), dtype=torch.float32, device=shard.device)
        else:
            out[n] = torch.zeros_like(shard)
    return out
