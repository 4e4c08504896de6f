"""``input_reshard``: keep only this rank's slice of a module's replicated saved activations between the
forward and the backward, as ``torch.distributed.tensor.parallel.input_reshard``.

Under tensor parallelism a block's input is the same on every TP rank; with activation checkpointing it
is all the block saves. While the module's forward runs, tensors autograd saves are packed: a
replicated DTensor becomes ``Shard(input_reshard_dim)`` (a local slice, no communication), a plain tensor
of at least ``mesh.size()`` elements is cut to this rank's ``torch.chunk`` piece; the backward gathers
them back (one all-gather each). Unlike PyTorch's, the packed plain tensor remembers its full shape, so
uneven pieces come back right, and the hooks are removed even when the forward raises.

Only use it where the saved plain tensors really are the same on every TP rank (a checkpointed block's
input): a tensor that differs per rank would come back as the ranks' pieces glued together.

>>> import torch
>>> from shardwise.tensor import init_device_mesh
>>> lin = input_reshard(torch.nn.Linear(4, 4), init_device_mesh("cpu", (1,)), 0)
>>> lin(torch.ones(3, 4, requires_grad=True)).sum().backward()
>>> input_reshard(lin, init_device_mesh("cpu", (1,)), None) is lin   # None: nothing to reshard
True
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from shardwise.tensor import DTensor, Replicate, Shard
from shardwise.tensor.spec import chunk_range

__all__ = ["input_reshard"]


def input_reshard(module: nn.Module, tp_device_mesh, input_reshard_dim: Optional[int] = None) -> nn.Module:
    """Register hooks on ``module`` that shard its saved activations along ``input_reshard_dim`` over the
    1-D ``tp_device_mesh`` after the forward and gather them back in the backward; returns ``module``.
    ``input_reshard_dim=None`` registers nothing."""
    if input_reshard_dim is None:
        return module
    if not isinstance(input_reshard_dim, int) or isinstance(input_reshard_dim, bool):
        raise TypeError(f"input_reshard(input_reshard_dim={input_reshard_dim!r}): expected an int or None")
    if tp_device_mesh.ndim != 1:
        raise ValueError(f"input_reshard: tp_device_mesh must be 1-D (the TP mesh), got shape {tuple(tp_device_mesh.shape)}; "
                         "pass the TP sub-mesh, e.g. mesh['tp']")
    mesh, dim = tp_device_mesh, input_reshard_dim
    hooks: list = []

    def pre_hook(_module, _args) -> None:
        ctx = torch.autograd.graph.saved_tensors_hooks(lambda x: _pack(mesh, dim, x), lambda x: _unpack(mesh, x))
        ctx.__enter__()
        hooks.append(ctx)

    def post_hook(_module, _args, _output) -> None:
        if hooks:
            hooks.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(pre_hook)
    module.register_forward_hook(post_hook, always_call=True)
    return module


class _Piece:
    """A plain tensor's slice kept between forward and backward, with what restores it."""

    __slots__ = ("local", "dim", "shape")

    def __init__(self, local, dim, shape):
        self.local, self.dim, self.shape = local, dim, shape


def _pack(mesh, dim: int, x: torch.Tensor) -> Any:
    if isinstance(x, DTensor):
        if all(isinstance(p, Replicate) for p in x.placements) and x.device_mesh is mesh and x.ndim > 0:
            return x.redistribute(mesh, [Shard(dim % x.ndim)])
        return x
    if x.ndim == 0 or x.numel() < mesh.size():
        return x
    d = dim % x.ndim
    start, length = chunk_range(x.shape[d], mesh.size(), mesh.get_local_rank())
    # a copy: a view would keep the whole buffer alive and save nothing
    return _Piece(x.narrow(d, start, length).clone(), d, x.shape)


def _unpack(mesh, x: Any) -> torch.Tensor:
    if isinstance(x, _Piece):
        dt = DTensor.from_local(x.local, mesh, [Shard(x.dim)], shape=x.shape)
        return dt.redistribute(mesh, [Replicate()]).to_local()
    if isinstance(x, DTensor) and len(x.placements) == 1 and isinstance(x.placements[0], Shard) \
            and x.device_mesh is mesh:
        return x.redistribute(mesh, [Replicate()])
    return x
