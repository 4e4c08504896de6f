"""The local maths of loss parallelism: cross-entropy, nll_loss and log_softmax over a class dim that
one mesh dim shards, as autograd Functions on DTensors whose local tensors hold a slice of the classes.

Forward, a row's log-sum-exp takes two all-reduces of one value per row (max, then the sum of
exponentials) and the target's logit one more (the rank holding the target class contributes it; with
label smoothing the weighted class sum travels in the same all-reduce). The cross-entropy backward is
local: ``softmax - one_hot`` (and the smoothing term) from the saved logits and log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from shardwise.tensor import DTensor, Replicate
from shardwise.tensor.collectives import all_reduce
from shardwise.tensor.spec import DTensorSpec, chunk_range

__all__ = ["ClassShard", "CrossEntropy", "NllLoss", "LogSoftmax"]


@dataclass(frozen=True)
class ClassShard:
    """Where this rank's classes sit: ``dim`` of the input, sharded over mesh dim ``tp``."""

    mesh: object
    tp: int
    dim: int
    classes: int
    offset: int

    @staticmethod
    def of(x, dim: int, tp: int) -> "ClassShard":
        mesh = x.device_mesh
        coord = mesh.get_coordinate()
        start, _ = chunk_range(x.shape[dim], mesh.size(tp), coord[tp])
        return ClassShard(mesh, tp, dim, x.shape[dim], start)

    def reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        return all_reduce(t, op, self.mesh, self.tp)


def _compute(x: torch.Tensor) -> torch.Tensor:
    # half precision accumulates in float32, as torch's log_softmax does
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _logsumexp(xl: torch.Tensor, cs: ClassShard) -> torch.Tensor:
    """Per row over the last (class) dim of the classes on all ranks: two all-reduces."""
    if xl.shape[-1]:
        m = xl.amax(-1)
    else:
        m = xl.new_full(xl.shape[:-1], -torch.inf)
    m = cs.reduce(m, "max")
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows of -inf/inf: no shift
    sumexp = cs.reduce(torch.exp(xl - m.unsqueeze(-1)).sum(-1), "sum")
    return m + torch.log(sumexp)


def _target_index(t: torch.Tensor, cs: ClassShard, ignore_index: int, width: int):
    """(rows not ignored, rows whose target class is here, the target's local index or 0)."""
    valid = t != ignore_index
    local = t - cs.offset
    here = valid & (local >= 0) & (local < width)
    return valid, here, torch.where(here, local, torch.zeros_like(local))


def _reduce(loss: torch.Tensor, reduction: str, total_weight: torch.Tensor) -> torch.Tensor:
    if reduction == "none":
        return loss
    total = loss.sum()
    return total if reduction == "sum" else total / total_weight


def _grad_scale(g: torch.Tensor, reduction: str, total_weight: torch.Tensor) -> torch.Tensor:
    """The incoming gradient per row (a scalar for sum/mean, broadcast over the rows)."""
    return g / total_weight if reduction == "mean" else g


@dataclass
class LossArgs:
    target: torch.Tensor  # local target (class indices)
    weight: Optional[torch.Tensor]  # full class weights, or None
    ignore_index: int
    reduction: str
    label_smoothing: float
    out_spec: DTensorSpec  # the loss's global layout
    grad_placements: tuple  # what the incoming gradient is moved to first


class CrossEntropy(torch.autograd.Function):
    """``F.cross_entropy`` of class-sharded logits; returns the loss DTensor."""

    @staticmethod
    def forward(ctx, x, cs: ClassShard, a: LossArgs):
        xl = _compute(x._local_tensor.movedim(cs.dim, -1))
        lse = _logsumexp(xl, cs)
        valid, here, idx = _target_index(a.target, cs, a.ignore_index, xl.shape[-1])
        z = torch.where(here, xl.gather(-1, idx.unsqueeze(-1)).squeeze(-1), torch.zeros_like(lse))
        wl = None
        parts = [z]
        if a.weight is not None:
            wl = a.weight.narrow(0, cs.offset, xl.shape[-1]).to(xl.dtype)
        if a.label_smoothing:
            parts.append((xl * wl).sum(-1) if wl is not None else xl.sum(-1))
        summed = cs.reduce(torch.stack(parts), "sum")
        wt = a.weight.to(xl.dtype)[torch.where(valid, a.target, 0)] if a.weight is not None else torch.ones_like(lse)
        wt = torch.where(valid, wt, torch.zeros_like(wt))
        loss = -(summed[0] - lse) * wt
        if a.label_smoothing:
            sum_w = a.weight.to(xl.dtype).sum() if a.weight is not None else float(cs.classes)
            smooth = torch.where(valid, -(summed[1] - lse * sum_w), torch.zeros_like(lse))
            loss = (1 - a.label_smoothing) * loss + (a.label_smoothing / cs.classes) * smooth
        total_weight = wt.sum()
        out = _reduce(loss, a.reduction, total_weight).to(x.dtype)
        ctx.save_for_backward(x._local_tensor, lse)
        ctx.cs, ctx.a, ctx.wl, ctx.parts = cs, a, wl, (valid, here, idx, wt, total_weight)
        ctx.x_spec = x._spec
        return DTensor._wrap(out, a.out_spec)

    @staticmethod
    def backward(ctx, g):
        x_local, lse = ctx.saved_tensors
        cs, a, wl = ctx.cs, ctx.a, ctx.wl
        valid, here, idx, wt, total_weight = ctx.parts
        xl = _compute(x_local.movedim(cs.dim, -1))
        gl = _grad_scale(_incoming(g, a), a.reduction, total_weight).to(xl.dtype)
        p = torch.exp(xl - lse.unsqueeze(-1))
        onehot = torch.zeros_like(p).scatter_(-1, idx.unsqueeze(-1), here.unsqueeze(-1).to(p.dtype))
        grad = (1 - a.label_smoothing) * wt.unsqueeze(-1) * (p - onehot)
        if a.label_smoothing:
            sum_w = a.weight.to(p.dtype).sum() if a.weight is not None else float(cs.classes)
            term = p * sum_w - (wl if wl is not None else 1.0)
            grad = grad + (a.label_smoothing / cs.classes) * term * valid.unsqueeze(-1)
        grad = (grad * gl.unsqueeze(-1) if gl.dim() else grad * gl).movedim(-1, cs.dim)
        return _wrap_grad(grad.to(x_local.dtype), ctx.x_spec, g), None, None


class NllLoss(torch.autograd.Function):
    """``F.nll_loss`` of class-sharded log-probabilities (one all-reduce forward, none backward)."""

    @staticmethod
    def forward(ctx, x, cs: ClassShard, a: LossArgs):
        xl = x._local_tensor.movedim(cs.dim, -1)
        valid, here, idx = _target_index(a.target, cs, a.ignore_index, xl.shape[-1])
        z = torch.where(here, xl.gather(-1, idx.unsqueeze(-1)).squeeze(-1), xl.new_zeros(idx.shape))
        z = cs.reduce(z, "sum")
        wt = a.weight.to(xl.dtype)[torch.where(valid, a.target, 0)] if a.weight is not None else torch.ones_like(z)
        wt = torch.where(valid, wt, torch.zeros_like(wt))
        total_weight = wt.sum()
        ctx.cs, ctx.a, ctx.parts, ctx.x_spec = cs, a, (here, idx, wt, total_weight), x._spec
        ctx.shape = xl.shape
        return DTensor._wrap(_reduce(-z * wt, a.reduction, total_weight), a.out_spec)

    @staticmethod
    def backward(ctx, g):
        cs, a = ctx.cs, ctx.a
        here, idx, wt, total_weight = ctx.parts
        gl = _grad_scale(_incoming(g, a), a.reduction, total_weight)
        val = -(wt * gl) * here
        grad = torch.zeros(ctx.shape, dtype=val.dtype, device=val.device)
        grad.scatter_(-1, idx.unsqueeze(-1), val.unsqueeze(-1))
        return _wrap_grad(grad.movedim(-1, cs.dim), ctx.x_spec, g), None, None


class LogSoftmax(torch.autograd.Function):
    """``log_softmax`` over a class-sharded dim: two all-reduces forward, one backward (the sum of the
    incoming gradient over the classes)."""

    @staticmethod
    def forward(ctx, x, cs: ClassShard, dtype):
        xl = x._local_tensor.movedim(cs.dim, -1)
        xl = xl.to(dtype) if dtype is not None else xl
        out = (_compute(xl) - _logsumexp(_compute(xl), cs).unsqueeze(-1)).to(xl.dtype)
        ctx.save_for_backward(out)
        ctx.cs, ctx.x_spec = cs, x._spec
        spec = x._spec
        out = out.movedim(-1, cs.dim)
        return DTensor._wrap(out, DTensorSpec(spec.mesh, spec.placements, spec.shape, spec.stride, out.dtype))

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        cs = ctx.cs
        if not isinstance(g, DTensor):
            raise TypeError("log_softmax under loss_parallel(): the gradient of a DTensor output must be a DTensor")
        gl = g.redistribute(placements=ctx.x_spec.placements)._local_tensor.movedim(cs.dim, -1)
        total = cs.reduce(gl.sum(-1, keepdim=True), "sum")
        grad = (gl - torch.exp(out) * total).movedim(-1, cs.dim)
        return _wrap_grad(grad.to(ctx.x_spec.dtype), ctx.x_spec, g), None, None


def _incoming(g, a: LossArgs) -> torch.Tensor:
    """The loss's gradient as local values in the layout the kernels expect."""
    if not isinstance(g, DTensor):  # a plain gradient: the full value, the same on every rank
        g = DTensor.from_local(g, a.out_spec.mesh, [Replicate()] * a.out_spec.mesh.ndim)
    return g.redistribute(placements=a.grad_placements)._local_tensor


def _wrap_grad(grad: torch.Tensor, x_spec: DTensorSpec, like) -> "DTensor":
    return DTensor._wrap(grad, DTensorSpec(x_spec.mesh, x_spec.placements, x_spec.shape, x_spec.stride, grad.dtype))
