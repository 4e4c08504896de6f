"""Fused optimizer steps (``torch.optim`` with ``fused=True``): ``_fused_adam_``, ``_fused_adamw_``,
``_fused_sgd_`` and ``_fused_adagrad_`` on DTensor parameters of any placements.

Each update is elementwise, so every rank runs the fused kernel on its local shards, as PyTorch's
DTensor does: no collective when the gradients have their parameters' placements. Element ``i`` of
every tensor list takes the layout of parameter ``i``:

- a gradient in another layout (a pending sum of a replicated weight, say) is redistributed to it, as
  PyTorch does; the kernel unscales gradients in place when given ``grad_scale``, so the unscaled
  value is moved back into the caller's gradient afterwards;
- optimizer state in another layout (SGD's momentum buffer is created like the gradient) is moved the
  same way and the updated values moved back into it, so the state stays right (PyTorch's DTensor
  updates a redistributed copy and drops it); such a move may cost collectives every step;
- ``state_steps``, ``lr``, ``grad_scale`` and ``found_inf`` are scalars: plain 0-d tensors, or
  replicated DTensors.

>>> import torch
>>> from shardwise.tensor import Shard, distribute_tensor, init_device_mesh, CollectiveCounter
>>> mesh = init_device_mesh("cpu", (1,))
>>> w = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
>>> opt = torch.optim.AdamW([w], lr=0.1, fused=True)
>>> w.sum().backward()
>>> with CollectiveCounter() as cc:
...     opt.step()
>>> cc.total, w.placements, round(w.full_tensor()[0, 0].item(), 4)
(0, (Shard(dim=0),), 0.899)
"""

from __future__ import annotations

import torch
from torch.ops import aten

from ...placements import Partial, Replicate
from ...propagation.propagator import Decision
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, TensorArg
from ...redistribute import execute_plan, plan_redistribute

__all__ = ["FUSED_OPS"]

# per op: the names of its tensor-list arguments after the parameters (schema order), and which of
# them the kernel writes besides the parameters
_LISTS = {
    "_fused_adam_": (("grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps"),
                     ("exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")),
    "_fused_adamw_": (("grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps"),
                      ("exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")),
    "_fused_sgd_": (("grads", "momentum_buffer_list"), ("momentum_buffer_list",)),
    "_fused_adagrad_": (("grads", "state_sums", "state_steps"), ("state_sums",)),
}
_SCALAR_LISTS = ("state_steps",)
FUSED_OPS = [getattr(getattr(aten, name), ov) for name in _LISTS for ov in ("default", "tensor_lr")]


def _name(op) -> str:
    return op._schema.name.split("::")[-1]


def _replicated(ta: TensorArg, mesh_shape) -> bool:
    return ta.placements is None or all(type(p) is Replicate for p in ta.placements)


def _check_scalar(op, what: str, ta: TensorArg, mesh_shape) -> None:
    if ta.ndim > 1 or (ta.ndim == 1 and ta.shape[0] != 1):
        raise ValueError(
            f"{op}: {what} must be a one-element scalar; got shape {tuple(ta.shape)}. Pass a 0-d tensor "
            "(torch.optim creates them so)"
        )
    if not _replicated(ta, mesh_shape):
        raise NotImplementedError(
            f"{op}: {what} has placements {[str(p) for p in ta.placements]}; a scalar of a fused optimizer step "
            "must be a plain tensor or replicated: redistribute it to Replicate() first"
        )


def fused_rule(schema, mesh_shape) -> Decision:
    """Checks the lists; moves nothing itself: a gradient or state tensor in another layout than its
    parameter is moved by the kernel, which also moves what the fused op wrote back into it."""
    name = _name(schema.op)
    list_names = _LISTS[name][0]
    params = schema.args[0]
    for i, ta in enumerate(params):
        _check_param(schema.op, name, i, ta)
    for li, lname in enumerate(list_names, 1):
        lst = schema.args[li]
        if lst and len(lst) != len(params):
            raise ValueError(f"{schema.op}: {lname} has {len(lst)} tensors for {len(params)} parameters")
        for i, ta in enumerate(lst):
            if lname in _SCALAR_LISTS:
                _check_scalar(schema.op, f"{lname}[{i}]", ta, mesh_shape)
            else:
                _check_element(schema.op, lname, i, ta, params[i])
    for k, v in schema.kwargs.items():
        if isinstance(v, TensorArg):
            _check_scalar(schema.op, k, v, mesh_shape)
    return Decision([None] * len(schema.tensor_args), [])


def _check_param(op, name: str, i: int, ta: TensorArg) -> None:
    pending = [p for p in ta.placements or () if isinstance(p, Partial)]
    # SGD's update is linear in the parameter, gradient and buffer: pending sums/averages update as parts
    if pending and not (name == "_fused_sgd_" and all(p.is_linear() for p in pending)):
        raise NotImplementedError(
            f"{op}: parameter {i} is a pending reduction {[str(p) for p in ta.placements]}; this update is not "
            "linear in it. Redistribute the parameter to Replicate() (or Shard) before the step"
        )


def _check_element(op, lname: str, i: int, ta: TensorArg, param: TensorArg) -> None:
    if (param.placements is None) != (ta.placements is None):
        raise ValueError(
            f"{op}: parameter {i} and {lname}[{i}] mix a DTensor with a plain tensor of shape {tuple(ta.shape)}; "
            "both must be DTensors on the same mesh"
        )
    if tuple(ta.shape) != tuple(param.shape):
        raise ValueError(f"{op}: {lname}[{i}] has shape {tuple(ta.shape)}, parameter {i} {tuple(param.shape)}")


def _moves(schema, mesh_shape) -> dict:
    """(list position, element) -> (steps to the parameter's layout, steps back, global shape, own
    placements, the parameter's placements) for every element not laid out as its parameter."""
    params = schema.args[0]
    moves = {}
    for li, lname in enumerate(_LISTS[_name(schema.op)][0], 1):
        if lname in _SCALAR_LISTS:
            continue
        for i, ta in enumerate(schema.args[li]):
            want = params[i].placements
            if ta.placements is not None and ta.placements != want:
                moves[li, i] = (plan_redistribute(ta.placements, want, mesh_shape, ta.ndim),
                                plan_redistribute(want, ta.placements, mesh_shape, ta.ndim),
                                tuple(ta.shape), ta.placements, want)
    return moves


def _fused_local(schema, decision, out_specs, mesh, coord):
    list_names, written = _LISTS[_name(schema.op)]
    n_lists = 1 + len(list_names)
    # what the kernel writes: the parameters, the state, and the gradients when it unscales them
    writes = {0} | {li for li, name in enumerate(list_names, 1) if name in written}
    moves = _moves(schema, tuple(mesh.shape))

    def kernel(op, args, kwargs):
        kwargs = {k: (v._local_tensor if hasattr(v, "_local_tensor") else v) for k, v in kwargs.items()}
        mine = [list(a) for a in args[:n_lists]]
        for li in range(n_lists):
            for i, x in enumerate(mine[li]):
                move = moves.get((li, i))
                if move is not None:
                    x = execute_plan(x, move[0], mesh, move[2], move[3], coord)
                # the CPU kernels read memory in order whatever the strides (a shard of dim 1 is strided)
                mine[li][i] = x if x.is_contiguous() else x.contiguous()
        op(*mine, *args[n_lists:], **kwargs)
        out = writes | {1} if kwargs.get("grad_scale") is not None else writes
        for li in out:
            for i, (x, orig) in enumerate(zip(mine[li], args[li])):
                move = moves.get((li, i))
                if move is not None:
                    orig.copy_(execute_plan(x, move[1], mesh, move[2], move[4], coord))
                elif x is not orig:
                    orig.copy_(x)
        return None

    return LocalPlan(kernel=kernel)


register_rule(*FUSED_OPS, local=_fused_local, pointwise=True, whole_mesh=True)(fused_rule)
