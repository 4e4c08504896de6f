"""``loss_parallel()``: cross-entropy on logits sharded along the class dim, without gathering them.

Inside the block, ``F.cross_entropy`` / ``nn.CrossEntropyLoss``, ``F.nll_loss`` and ``log_softmax`` of a
DTensor sharded on its class dim (dim 1, or 0 for a 1-D input) by exactly one mesh dim run on the
local class slices: a log-sum-exp from two all-reduces of one value per row, the target's logit from
one more, and a local backward (see ``_loss_kernels.py``). The collectives per loss equal PyTorch's.
Semantics and errors follow ``torch.distributed.tensor.parallel.loss_parallel``:

- the other mesh dims must be ``Shard`` (of other dims) or ``Replicate``, else ``ValueError``;
- ``target`` holds class indices; it is laid out as the input without its class dim (a plain tensor is
  accepted only where that layout is all ``Replicate``, else ``ValueError``; a DTensor in another
  layout raises ``RuntimeError``); ``weight`` is replicated;
- ``reduction="none"`` keeps the target's layout; ``"sum"``/``"mean"`` give a scalar, ``Replicate`` on
  the class mesh dim and a pending sum over other sharded mesh dims; ``"mean"`` needs a 1-D mesh.

Unlike PyTorch's, ``label_smoothing`` is supported (its class sum joins the target's all-reduce), and
the block is a context variable: another thread keeps the ordinary behaviour, and a backward that runs
after the block still has the right gradients (the Functions carry their own backward).

>>> import torch, torch.nn.functional as F
>>> from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
>>> mesh = init_device_mesh("cpu", (1,))
>>> logits, target = torch.randn(4, 10), torch.tensor([1, 9, -100, 3])
>>> x = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
>>> with loss_parallel():
...     loss = F.cross_entropy(x, target)
...     loss.backward()
>>> torch.allclose(loss.full_tensor(), F.cross_entropy(logits, target)), x.grad.placements
(True, (Shard(dim=1),))
"""

from __future__ import annotations

import contextlib
import inspect

import torch
import torch.nn.functional as F

from shardwise.tensor import DTensor, Partial, Replicate, Shard
from shardwise.tensor._switch import Switch
from shardwise.tensor.callpath.function_hooks import HOOKS
from shardwise.tensor.spec import DTensorSpec

from ._loss_kernels import ClassShard, CrossEntropy, LogSoftmax, LossArgs, NllLoss

__all__ = ["loss_parallel", "LOSS_PARALLEL"]

LOSS_PARALLEL = Switch("loss_parallel", False)


@contextlib.contextmanager
def loss_parallel():
    """Compute cross-entropy (and ``nll_loss`` / ``log_softmax``) on class-sharded DTensor logits in
    this block without gathering them (see the module docstring). Put the loss's ``backward()`` in
    the block too, as PyTorch asks (ours also runs it correctly after the block)."""
    with HOOKS.enabled(LOSS_PARALLEL):
        yield


def _class_mesh_dim(placements, dim: int) -> int:
    """The one mesh dim that shards tensor dim ``dim`` (PyTorch's checks and messages)."""
    shard = [m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == dim]
    if len(shard) != 1:
        raise ValueError(
            f"loss_parallel() requires exactly one mesh dim to shard tensor dimension {dim}, but got placements "
            f"{tuple(placements)} with {len(shard)} such mesh dim(s). Shard the class dim, e.g. with "
            "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) on the output projection"
        )
    for m, p in enumerate(placements):
        if m != shard[0] and not isinstance(p, (Shard, Replicate)):
            raise ValueError(f"loss_parallel() expects non-TP mesh dims to be Shard or Replicate, got {p} at dim {m}.")
    return shard[0]


def _derived(placements, tp: int, dim: int) -> tuple:
    """The target's layout: the input's without its class dim."""
    out = []
    for m, p in enumerate(placements):
        if m == tp or not isinstance(p, Shard):
            out.append(Replicate())
        else:
            out.append(Shard(p.dim - 1) if p.dim > dim else p)
    return tuple(out)


def _local_of(t, placements, mesh, what: str):
    if isinstance(t, DTensor):
        if t.placements != placements:
            raise RuntimeError(f"Expected {placements} but got {t.placements}.")
        return t._local_tensor
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"loss_parallel(): {what} must be a tensor, got {type(t).__name__}")
    if any(isinstance(p, Shard) for p in placements):
        raise ValueError(
            f"loss_parallel() requires a DTensor (not a plain torch.Tensor) {what} when the derived placements "
            f"{placements} contain Shard; wrap it with DTensor.from_local or distribute_tensor"
        )
    return t


def _loss_args(x, cdim: int, tp: int, target, weight, ignore_index, reduction, smoothing) -> LossArgs:
    mesh = x.device_mesh
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction={reduction!r}: use 'none', 'sum' or 'mean'")
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        raise NotImplementedError("loss_parallel(): target must hold class indices (class probabilities are not "
                                  "supported, as in PyTorch); pass integer targets")
    if reduction == "mean" and mesh.ndim > 1:
        raise NotImplementedError(
            "loss_parallel() with reduction='mean' is only supported on one-dimensional DeviceMesh; got mesh with "
            f"ndim={mesh.ndim}. Use reduction='sum' or 'none' instead."
        )
    t_pl = _derived(x.placements, tp, cdim)
    local_t = _local_of(target, t_pl, mesh, "target")
    w = None if weight is None else _local_of(weight, (Replicate(),) * mesh.ndim, mesh, "weight")
    if reduction == "none":
        out_pl, shape = t_pl, tuple(s for d, s in enumerate(x.shape) if d != cdim)
    else:
        out_pl = tuple(Replicate() if m == tp or not isinstance(p, Shard) else Partial()
                       for m, p in enumerate(x.placements))
        shape = ()
    stride = torch.empty(shape, device="meta").stride()
    out_spec = DTensorSpec(mesh, out_pl, shape, stride, x.dtype)
    grad_pl = t_pl if reduction == "none" else (Replicate(),) * mesh.ndim
    return LossArgs(local_t, w, int(ignore_index), reduction, float(smoothing), out_spec, grad_pl)


_CE = inspect.signature(F.cross_entropy)
_NLL = inspect.signature(F.nll_loss)


def _reduction(b) -> str:
    if b.arguments.get("size_average") is not None or b.arguments.get("reduce") is not None:
        from torch.nn import _reduction as legacy

        return legacy.legacy_get_string(b.arguments.get("size_average"), b.arguments.get("reduce"))
    return b.arguments.get("reduction", "mean")


def _loss(sig, fn, args, kwargs):
    b = sig.bind(*args, **kwargs)
    x = b.arguments["input"]
    if not isinstance(x, DTensor):
        return NotImplemented
    cdim = 1 if x.ndim >= 2 else 0
    tp = _class_mesh_dim(x.placements, cdim)
    a = _loss_args(x, cdim, tp, b.arguments["target"], b.arguments.get("weight"), b.arguments.get("ignore_index", -100),
                   _reduction(b), b.arguments.get("label_smoothing", 0.0))
    return fn.apply(x, ClassShard.of(x, cdim, tp), a)


def _cross_entropy(func, args, kwargs):
    return _loss(_CE, CrossEntropy, args, kwargs)


def _nll_loss(func, args, kwargs):
    return _loss(_NLL, NllLoss, args, kwargs)


def _log_softmax(func, args, kwargs):
    x = args[0] if args else kwargs.get("input", kwargs.get("self"))
    if not isinstance(x, DTensor):
        return NotImplemented
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None:
        raise ValueError("log_softmax under loss_parallel(): pass dim (the sharded class dim)")
    dtype = kwargs.get("dtype", args[3] if func is F.log_softmax and len(args) > 3 else None)
    dim = dim + x.ndim if dim < 0 else dim
    tp = _class_mesh_dim(x.placements, dim)
    return LogSoftmax.apply(x, ClassShard.of(x, dim, tp), dtype)


HOOKS.register([F.cross_entropy], LOSS_PARALLEL, _cross_entropy)
HOOKS.register([F.nll_loss], LOSS_PARALLEL, _nll_loss)
HOOKS.register([F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax, torch.special.log_softmax],
               LOSS_PARALLEL, _log_softmax)
