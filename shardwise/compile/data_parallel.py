"""``DataParallel``: replicate, fully-shard, or choose per parameter.

Example::

    mesh = init_device_mesh("cpu", (2,))

    @shardwise.compile.compile(parallel_mode=DataParallel(mesh, style="fully_shard"))
    def step(model, opt, x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step(model, opt, x_global, y_global)  # each rank trains on its slice of dim 0
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch
import torch.utils._pytree as pytree

from .dp_partition import build_dp_graph
from .layout import choose_layouts
from .modes import ParallelMode
from .passes import run_passes
from .state import TrainState

__all__ = ["DataParallel"]

_STYLES = ("replicate", "fully_shard", "default")


class DataParallel(ParallelMode):
    """Data parallel over a 1-D mesh; every rank gets ``batch / N`` along ``input_batch_dim``.

    ``style``: ``"replicate"`` (DDP: replicated parameters, averaged
    all-reduced gradients), ``"fully_shard"`` (FSDP: ``Shard(0)``
    parameters and optimizer state, all-gather before forward and again
    before backward, reduce-scattered gradients) or ``"default"`` (shard
    parameters with at least ``shard_threshold`` elements, replicate the rest;
    ``shard_rule(fqn, param) -> True/False/None`` overrides by name).

    ``input_batch_dim`` is one int for every batch argument, or one entry per
    argument (``None`` = pass that argument whole to every rank).
    ``bucket_cap_bytes``/``gather_bucket_cap_bytes`` size collective buckets
    (0 = one collective per parameter).
    """

    def __init__(
        self,
        mesh,
        style: str = "replicate",
        input_batch_dim: Union[int, Sequence[Optional[int]]] = 0,
        *,
        shard_threshold: int = 1 << 16,
        shard_rule: Callable | None = None,
        bucket_cap_bytes: int = 4 << 20,
        gather_bucket_cap_bytes: int = 4 << 20,
    ):
        if style not in _STYLES:
            raise ValueError(f"DataParallel style={style!r} is not one of {_STYLES}")
        if getattr(mesh, "ndim", None) != 1:
            raise ValueError(
                f"DataParallel needs a 1-D DeviceMesh, got {mesh!r}; "
                "build one with init_device_mesh(device_type, (world_size,))"
            )
        dims = [input_batch_dim] if isinstance(input_batch_dim, int) else list(input_batch_dim)
        if not all(d is None or (isinstance(d, int) and d >= 0) for d in dims):
            raise TypeError(
                f"input_batch_dim={input_batch_dim!r} must be a non-negative int or a sequence of "
                "non-negative ints/None (one per batch argument)"
            )
        for name, v in (("bucket_cap_bytes", bucket_cap_bytes), ("gather_bucket_cap_bytes", gather_bucket_cap_bytes),
                        ("shard_threshold", shard_threshold)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r} must be a non-negative int")
        self.mesh, self.style, self.input_batch_dim = mesh, style, input_batch_dim
        self.shard_threshold, self.shard_rule = shard_threshold, shard_rule
        self.bucket_cap_bytes, self.gather_bucket_cap_bytes = bucket_cap_bytes, gather_bucket_cap_bytes
        self.world = mesh.size()

    def __repr__(self) -> str:
        return f"DataParallel(style={self.style!r}, input_batch_dim={self.input_batch_dim!r}, world={self.world})"

    def setup(self, model, optimizer, spec) -> TrainState:
        params = {n: p.detach() for n, p in model.named_parameters()}
        layouts = choose_layouts(self.style, params, self.world, self.shard_threshold, self.shard_rule)
        return TrainState(model, optimizer, layouts, self.mesh, spec)

    def local_batch(self, batch: tuple) -> tuple:
        dims = self.input_batch_dim
        dims = [dims] * len(batch) if isinstance(dims, int) else list(dims)
        if len(dims) != len(batch):
            raise ValueError(
                f"input_batch_dim has {len(dims)} entries but the step got {len(batch)} batch "
                "arguments; give one entry per argument (None = not split)"
            )
        rank = self.mesh.get_local_rank()
        out = []
        for i, (arg, dim) in enumerate(zip(batch, dims)):
            out.append(arg if dim is None else pytree.tree_map(
                lambda t, i=i, dim=dim: self._slice(t, i, dim, rank), arg))
        return tuple(out)

    def _slice(self, t, i: int, dim: int, rank: int):
        if not isinstance(t, torch.Tensor):
            return t
        if t.dim() <= dim:
            raise ValueError(
                f"batch argument {i} has shape {tuple(t.shape)}, which has no batch dim {dim}; "
                "set input_batch_dim (None for arguments that are not split)"
            )
        size = t.shape[dim]
        if size % self.world:
            raise ValueError(
                f"batch argument {i} has size {size} along batch dim {dim}, not divisible by the "
                f"{self.world} data-parallel ranks; use a global batch that is a multiple of {self.world}"
            )
        part = size // self.world
        return t.narrow(dim, rank * part, part).contiguous()

    def partition(self, joint, state, spec, local_batch, fake_mode):
        return build_dp_graph(
            joint, state, spec, self.world, self.mesh.get_group().group_name, fake_mode, local_batch
        )

    def transform_and_compile(self, gm, gm_transformation=None):
        run_passes(gm, self.world, self.bucket_cap_bytes, self.gather_bucket_cap_bytes)
        gm.recompile()
        return gm_transformation(gm) if gm_transformation is not None else gm
