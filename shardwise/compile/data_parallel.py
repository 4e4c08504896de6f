"""``DataParallel``: replicate, fully-shard, or choose per parameter.

Example (each rank passes its own batch, as with DDP)::

    @shardwise.compile.compile(parallel_mode=DataParallel("fully_shard"))
    def step(model, opt, x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for x, y in loader:                # this rank's shard of the data
        step(model, opt, x, y)         # trains like one process on all ranks' batches together
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch
import torch.utils._pytree as pytree

from .dp_partition import build_dp_graph
from .layout import choose_layouts
from .modes import ParallelMode, mesh_first
from .passes import run_passes
from .state import TrainState

__all__ = ["DataParallel"]

_STYLES = ("replicate", "fully_shard", "default")
_INPUTS = ("local", "global")
_UNSET = object()  # input_batch_dim not given (default 0); None has a meaning inside a sequence


class DataParallel(ParallelMode):
    """Data parallel over a 1-D mesh: ``DataParallel(style="replicate", *, mesh=None, input="local", ...)``.

    ``style`` (or ``parallel_style=``, the name ``torch.distributed._spmd`` used): ``"replicate"``
    (DDP: replicated parameters, averaged all-reduced gradients), ``"fully_shard"`` (FSDP: ``Shard(0)``
    parameters and optimizer state, all-gather before forward and again before backward,
    reduce-scattered gradients) or ``"default"`` (shard parameters with at least ``shard_threshold``
    elements, replicate the rest; ``shard_rule(fqn, param) -> True/False/None`` overrides by name).

    ``mesh``: a 1-D ``DeviceMesh``; ``None`` = all ranks of the default process group, on its device
    (CUDA when the group has a CUDA backend and this process a GPU: ``cuda:LOCAL_RANK``), built on the
    first step. ``DataParallel(mesh, style, input_batch_dim)`` (mesh first) still works.

    ``input="local"`` (default): each rank passes its own batch, as with DDP; the step trains like one
    process on the concatenation of all ranks' batches (all ranks' batches must have the same shapes,
    checked every call). ``input="global"``: every rank passes the same whole batch and trains on its
    ``1/N`` slice along ``input_batch_dim`` (which must then divide evenly).

    ``input_batch_dim`` is one int for every batch argument, or one entry per argument (``None`` = not a
    batch: the same on every rank, never split). ``bucket_cap_bytes``/``gather_bucket_cap_bytes`` size
    collective buckets (0 = one collective per parameter). The step returns this rank's results
    (e.g. the loss of its own batch).

    Example: see the ``shardwise.compile`` package's (a ``DataParallel("fully_shard")`` step).
    """

    carries_agreement = True  # its graphs carry the ranks' agreement check in a gradient bucket

    def __init__(
        self,
        *args,
        style: Optional[str] = None,
        parallel_style: Optional[str] = None,
        mesh=None,
        input: str = "local",
        input_batch_dim: Union[int, Sequence[Optional[int]]] = _UNSET,
        shard_threshold: int = 1 << 16,
        shard_rule: Callable | None = None,
        bucket_cap_bytes: int = 4 << 20,
        gather_bucket_cap_bytes: int = 4 << 20,
    ):
        mesh, rest = mesh_first("DataParallel", args, mesh)
        # positional order: style, then (mesh-first form only) input_batch_dim
        style, input_batch_dim = _positional(rest, style, parallel_style, input_batch_dim, legacy=len(rest) < len(args))
        if style not in _STYLES:
            raise ValueError(f"DataParallel style={style!r} is not one of {_STYLES}")
        if input not in _INPUTS:
            raise ValueError(
                f"DataParallel input={input!r} is not one of {_INPUTS}: 'local' = each rank passes its own "
                "batch (DDP), 'global' = every rank passes the whole batch and trains on its slice"
            )
        self.mesh = mesh  # validated now; None is resolved on first use
        if not _valid_batch_dims(input_batch_dim):
            raise TypeError(
                f"input_batch_dim={input_batch_dim!r} must be a non-negative int or a sequence of "
                "non-negative ints/None (one per batch argument)"
            )
        for name, v in (("bucket_cap_bytes", bucket_cap_bytes), ("gather_bucket_cap_bytes", gather_bucket_cap_bytes),
                        ("shard_threshold", shard_threshold)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r} must be a non-negative int")
        self.style, self.input, self.input_batch_dim = style, input, input_batch_dim
        self.shard_threshold, self.shard_rule = shard_threshold, shard_rule
        self.bucket_cap_bytes, self.gather_bucket_cap_bytes = bucket_cap_bytes, gather_bucket_cap_bytes

    def __repr__(self) -> str:
        world = self._mesh.size() if self._mesh is not None else "default group"
        return (f"DataParallel(style={self.style!r}, input={self.input!r}, input_batch_dim={self.input_batch_dim!r}, "
                f"world={world})")

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
        rank = self.mesh.get_local_rank() if self.input == "global" else None
        out = []
        for i, (arg, dim) in enumerate(zip(batch, dims)):
            out.append(arg if dim is None else pytree.tree_map(
                lambda t, i=i, dim=dim: self._slice(t, i, dim, rank), arg))
        return tuple(out)

    def _slice(self, t, i: int, dim: int, rank: Optional[int]):
        """This rank's part of one batch tensor: all of it for local input, else its slice."""
        if not isinstance(t, torch.Tensor):
            return t
        if t.dim() <= dim:
            raise ValueError(
                f"batch argument {i} has shape {tuple(t.shape)}, which has no batch dim {dim}; "
                "set input_batch_dim (None for arguments that are not batches)"
            )
        if rank is None:
            return t
        size = t.shape[dim]
        if size % self.world:
            raise ValueError(
                f"batch argument {i} has size {size} along batch dim {dim}, not divisible by the "
                f"{self.world} data-parallel ranks; with input='global' use a batch that is a multiple of "
                f"{self.world}, or pass each rank its own batch with input='local'"
            )
        part = size // self.world
        return t.narrow(dim, rank * part, part).contiguous()

    def partition(self, joint, state, spec, local_batch, fake_mode):
        return build_dp_graph(
            joint, state, spec, self.world, self.mesh.get_group().group_name, fake_mode, local_batch,
            self.bucket_cap_bytes,
        )

    def transform_and_compile(self, gm, gm_transformation=None):
        # a transformation such as torch.compile functionalizes the graph: no in-place collectives for it
        run_passes(gm, self.world, self.bucket_cap_bytes, self.gather_bucket_cap_bytes,
                   functional=gm_transformation is not None)
        gm.recompile()
        return gm_transformation(gm) if gm_transformation is not None else gm


def _valid_batch_dims(dims) -> bool:
    ok = lambda d: isinstance(d, int) and not isinstance(d, bool) and d >= 0  # noqa: E731
    if isinstance(dims, (list, tuple)):
        return all(d is None or ok(d) for d in dims)
    return ok(dims)


def _positional(args: tuple, style, parallel_style, input_batch_dim, legacy: bool):
    """Resolve ``style``/``parallel_style``/``input_batch_dim`` from positional and keyword arguments."""
    names = ("style", "input_batch_dim") if legacy else ("style",)
    if len(args) > len(names):
        raise TypeError(
            f"DataParallel takes at most {len(names)} positional argument(s) ({', '.join(names)}), got {len(args)}; "
            "pass the rest by keyword, e.g. DataParallel('fully_shard', mesh=mesh, input_batch_dim=0)"
        )
    given = dict(zip(names, args))
    for name, kw in (("style", style), ("input_batch_dim", input_batch_dim)):
        if name in given and kw is not None and kw is not _UNSET:
            raise TypeError(f"DataParallel got {name} twice (positionally and by keyword)")
    style = given.get("style", style)
    if parallel_style is not None:
        if style is not None and style != parallel_style:
            raise TypeError(
                f"DataParallel got style={style!r} and parallel_style={parallel_style!r}; they name the same "
                "setting, give one"
            )
        style = parallel_style
    dims = given.get("input_batch_dim", input_batch_dim)
    return ("replicate" if style is None else style), (0 if dims is _UNSET else dims)
