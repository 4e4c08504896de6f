"""Capture a train step's forward + backward as one functional aten graph.

The user's step is ``step(model, optimizer, *batch)`` calling
``loss.backward()`` and ``optimizer.step()``.  While tracing, parameters and
buffers are swapped for graph inputs (``_reparametrize_module``),
``Tensor.backward`` becomes ``torch.autograd.grad`` (so gradients are graph
*outputs*) and ``optimizer.step``/``zero_grad`` only record that they were
called: the update is traced separately on shard shapes (see ``optim.py``).

Every node created while ``backward`` runs is tagged ``backward`` by
construction (we watch the tracer's graph), and every placeholder/output is
tagged with its provenance in :mod:`classify` — no positional guessing.

Example::

    joint = trace_joint(step, model, opt, fake_params, fake_buffers, (x, y))
    joint.gm.print_readable()
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx
from torch.nn.utils.stateless import _reparametrize_module

from .classify import classify_joint

__all__ = ["JointGraph", "trace_joint"]


@dataclass
class JointGraph:
    """Forward+backward graph: inputs ``(params, buffers, batch tensors)``.

    Outputs are ``(*user_output_tensors, *grads)``; ``grads[i]`` belongs to
    ``param_names[i]`` and is ``None`` when that parameter got no gradient.
    """

    gm: torch.fx.GraphModule
    param_names: tuple[str, ...]
    buffer_names: tuple[str, ...]
    n_batch: int
    out_spec: Any  # pytree spec of the user's return value
    out_consts: tuple  # per user output leaf: (is_tensor, constant value or None)
    n_user_out: int
    has_grad: tuple[bool, ...]
    fake_mode: Any = None  # the FakeTensorMode its meta['val'] tensors belong to


class _StepRecorder:
    """Stands in for ``backward``/``optimizer.step`` while tracing."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.grads: list[torch.Tensor | None] | None = None
        self.backward_nodes: set[str] = set()
        self.stepped = False

    def backward(self, loss: torch.Tensor, gradient=None, *args, **kwargs):
        if self.grads is not None:
            raise ValueError(
                "loss.backward() was called twice in one step; shardwise.compile supports "
                "exactly one backward per step: sum the losses and call backward once"
            )
        if self.stepped:
            raise ValueError("optimizer.step() ran before loss.backward(); call backward first")
        graph = get_proxy_mode().tracer.graph
        before = {n.name for n in graph.nodes}
        seed = torch.ones_like(loss) if gradient is None else gradient
        wanted = [p for p in self.params if p.requires_grad]
        got = iter(torch.autograd.grad(loss, wanted, grad_outputs=seed, allow_unused=True))
        self.grads = [next(got) if p.requires_grad else None for p in self.params]
        self.backward_nodes = {n.name for n in graph.nodes} - before

    def step(self, *args, **kwargs):
        if self.grads is None:
            raise ValueError("optimizer.step() ran before loss.backward(); call backward first")
        if self.stepped:
            raise ValueError("optimizer.step() was called twice in one step; call it once")
        self.stepped = True


@contextlib.contextmanager
def _patched(optimizer, rec: _StepRecorder):
    orig_backward = torch.Tensor.backward
    # An LR scheduler wraps `optimizer.step` as an instance attribute: restore
    # exactly what was there rather than deleting it.
    saved = {k: optimizer.__dict__[k] for k in ("step", "zero_grad") if k in optimizer.__dict__}
    torch.Tensor.backward = lambda self, *a, **k: rec.backward(self, *a, **k)
    optimizer.step = rec.step
    optimizer.zero_grad = lambda *a, **k: None
    try:
        yield
    finally:
        torch.Tensor.backward = orig_backward
        for k in ("step", "zero_grad"):
            if k in saved:
                setattr(optimizer, k, saved[k])
            else:
                delattr(optimizer, k)


def trace_joint(
    step_fn: Callable,
    model: torch.nn.Module,
    optimizer: Any,
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    batch: tuple,
) -> JointGraph:
    """Trace ``step_fn(model, optimizer, *batch)`` with fake tensors.

    ``params``/``buffers`` give full (global) shapes; ``batch`` holds this
    rank's local slice.  Non-tensor batch leaves are baked in as constants.
    """
    leaves, batch_spec = pytree.tree_flatten(batch)
    is_t = [isinstance(x, torch.Tensor) for x in leaves]
    consts = [None if t else x for x, t in zip(leaves, is_t)]
    p_names, b_names = tuple(params), tuple(buffers)
    # Trainability comes from the live module, not from the (detached) inputs.
    live = dict(model.named_parameters())
    trainable = [live[n].requires_grad for n in p_names]
    box: dict[str, Any] = {}

    def joint(p_list, b_list, t_leaves):
        p_list = [p.detach().requires_grad_(t) for p, t in zip(p_list, trainable)]
        it = iter(t_leaves)
        full = [next(it) if t else c for t, c in zip(is_t, consts)]
        rec = _StepRecorder(p_list)
        state = {**dict(zip(p_names, p_list)), **dict(zip(b_names, b_list))}
        with _reparametrize_module(model, state, tie_weights=True), _patched(optimizer, rec):
            out = step_fn(model, optimizer, *pytree.tree_unflatten(full, batch_spec))
        if rec.grads is None or not rec.stepped:
            raise ValueError(
                "the step must call loss.backward() and optimizer.step() exactly once; "
                f"backward called: {rec.grads is not None}, step called: {rec.stepped}"
            )
        out_leaves, box["out_spec"] = pytree.tree_flatten(out)
        box["out_consts"] = tuple(
            (True, None) if isinstance(o, torch.Tensor) else (False, o) for o in out_leaves
        )
        box["backward"] = rec.backward_nodes
        box["has_grad"] = tuple(g is not None for g in rec.grads)
        user = [o.detach() for o in out_leaves if isinstance(o, torch.Tensor)]
        box["n_user"] = len(user)
        return user + [g for g in rec.grads]

    tensors = [x for x, t in zip(leaves, is_t) if t]
    gm = make_fx(joint, tracing_mode="fake")(
        [params[n] for n in p_names], [buffers[n] for n in b_names], tensors
    )
    jg = JointGraph(
        gm, p_names, b_names, len(tensors), box["out_spec"], box["out_consts"],
        box["n_user"], box["has_grad"],
    )
    classify_joint(jg, box["backward"])
    return jg
