"""Tensor-parallel styles: how one module's parameters, inputs and outputs are laid out on a 1-D mesh.

Names, arguments and semantics follow ``torch.distributed.tensor.parallel``. A style distributes the
module's parameters as DTensors (through ``distribute_module``) and installs forward hooks that lay
out inputs and outputs; the module's own ``forward`` then runs per op on DTensors. A plain-tensor
input is taken as this rank's even piece (no communication, as torch's); ``uneven_shards=True``
accepts uneven ``torch.chunk`` pieces at the cost of one small all-reduce per forward (see _layout.py).

>>> from shardwise.parallel import parallelize_module; from shardwise.tensor import init_device_mesh
>>> model = nn.ModuleDict({"emb": nn.Embedding(10, 4), "up": nn.Linear(4, 8), "down": nn.Linear(8, 4)})
>>> plan = {"emb": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
>>> model = parallelize_module(model, init_device_mesh("cpu", (1,)), plan)
>>> [str(m.weight.placements[0]) for m in model.values()]    # rows, output features, input features
['S(0)', 'S(0)', 'S(1)']
"""

from __future__ import annotations

import torch
from torch import nn

from shardwise.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor

from ._layout import check_flag, check_placement, from_dtensor, to_dtensor

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel"]


class ParallelStyle:
    """Base of the styles: ``_apply(module, device_mesh)`` (torch's name; ``apply`` is the same)
    parallelizes one module in place. ``src_data_rank`` is set by ``parallelize_module``."""

    supported: tuple = ()
    owns_parameters = False  # distributes the module's parameters (at most one such style per module)
    src_data_rank = 0

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must define _apply(module, device_mesh)")

    def apply(self, module: nn.Module, device_mesh) -> nn.Module:
        return self._apply(module, device_mesh)

    def check(self, name: str, module: nn.Module) -> None:
        """Raise before anything is changed when this style cannot parallelize ``module``."""
        if self.supported and not isinstance(module, self.supported):
            kinds = ", ".join(t.__name__ for t in self.supported)
            raise TypeError(
                f"{type(self).__name__} cannot parallelize module {name!r} of type {type(module).__name__}; "
                f"it supports {kinds}. Map {name!r} to another style or to a submodule of a supported type"
            )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def _distribute_params(module: nn.Module, mesh, placements: dict, src_data_rank) -> None:
    for name, param in list(module.named_parameters(recurse=False)):
        pl = placements.get(name, Replicate())
        dt = distribute_tensor(param.detach(), mesh, [pl], src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(dt, requires_grad=param.requires_grad))


class _TPStyle(ParallelStyle):
    supported = (nn.Linear, nn.Embedding)
    owns_parameters = True

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True,
                 uneven_shards: bool = False):
        name = type(self).__name__
        self.input_layouts = check_placement(input_layouts, "input_layouts", name)
        self.output_layouts = check_placement(output_layouts, "output_layouts", name)
        self.use_local_output = check_flag(use_local_output, "use_local_output", name)
        self.uneven_shards = check_flag(uneven_shards, "uneven_shards", name)

    def _layouts(self, module) -> tuple:
        """(input layout, layout the computation needs, output layout, parameter placements)."""
        raise NotImplementedError

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        src, want, out, params = self._layouts(module)
        # the global input-feature count is the module's: no guess, no collective
        known = {-1: module.in_features} if isinstance(module, nn.Linear) else {}
        uneven, use_local, src_rank = self.uneven_shards, self.use_local_output, self.src_data_rank

        def partition(name, mod, mesh):
            if mod is module:
                _distribute_params(mod, mesh, params, src_rank)

        def input_fn(mod, args, mesh):
            return (to_dtensor(args[0], mesh, src, want, uneven, known),) + tuple(args[1:])

        def output_fn(mod, output, mesh):
            return from_dtensor(output, mesh, out, use_local)

        return distribute_module(module, device_mesh, partition, input_fn, output_fn)


class ColwiseParallel(_TPStyle):
    """Shard a Linear's output features (weight and bias ``Shard(0)``) or an Embedding's columns
    (``Shard(1)``). Input: ``Replicate()`` by default; output: ``Shard(-1)`` by default;
    ``use_local_output=True`` returns the local piece. ``uneven_shards=True``: see the module docstring.

    >>> from shardwise.parallel import parallelize_module; from shardwise.tensor import init_device_mesh
    >>> model = parallelize_module(nn.ModuleDict({"up": nn.Linear(4, 8)}), init_device_mesh("cpu", (1,)),
    ...                            {"up": ColwiseParallel()})
    >>> model["up"].weight.placements, model["up"](torch.ones(2, 4)).shape   # a plain output piece
    ((Shard(dim=0),), torch.Size([2, 8]))
    """

    def _layouts(self, module):
        src = self.input_layouts or Replicate()
        out = self.output_layouts or Shard(-1)
        if isinstance(module, nn.Linear):
            return src, Replicate(), out, {"weight": Shard(0), "bias": Shard(0)}
        return src, Replicate(), out, {"weight": Shard(1)}


class RowwiseParallel(_TPStyle):
    """Shard a Linear's input features (weight ``Shard(1)``, bias replicated; input ``Shard(-1)`` by
    default) or an Embedding's rows (``Shard(0)``; replicated ids by default, where torch's default
    is ``Shard(-1)``: pass ``input_layouts`` explicitly to be portable). The partial result is reduced
    to ``output_layouts``: ``Replicate()`` by default (one all-reduce) or e.g. ``Shard(1)`` (one
    reduce-scatter). Uneven feature and row counts (10 rows on 3 ranks) work.

    >>> from shardwise.parallel import parallelize_module; from shardwise.tensor import init_device_mesh
    >>> model = parallelize_module(nn.ModuleDict({"emb": nn.Embedding(10, 4)}), init_device_mesh("cpu", (1,)),
    ...                            {"emb": RowwiseParallel(output_layouts=Shard(1))})
    >>> model["emb"].weight.placements, model["emb"](torch.tensor([1, 9])).shape   # this rank's columns
    ((Shard(dim=0),), torch.Size([2, 4]))
    """

    def _layouts(self, module):
        out = self.output_layouts or Replicate()
        if isinstance(module, nn.Linear):
            src = self.input_layouts or Shard(-1)
            return src, Shard(-1), out, {"weight": Shard(1), "bias": Replicate()}
        return self.input_layouts or Replicate(), Replicate(), out, {"weight": Shard(0)}


class SequenceParallel(ParallelStyle):
    """Replicate a module's parameters and run it on input sharded along ``sequence_dim`` (LayerNorm,
    RMSNorm, Dropout: ops that act per position). A plain-tensor input is taken as this rank's
    sequence piece; a DTensor input is redistributed to ``Shard(sequence_dim)``. The output stays
    sequence-sharded (a DTensor unless ``use_local_output=True``).

    Like torch's, the parameters are replicated from each rank's own values (no broadcast): every
    rank must hold the same values (LayerNorm's ones/zeros, or the same seed).

    >>> from shardwise.parallel import parallelize_module; from shardwise.tensor import init_device_mesh
    >>> block = parallelize_module(nn.ModuleDict({"norm": nn.LayerNorm(4)}), init_device_mesh("cpu", (1,)),
    ...                            {"norm": SequenceParallel()})
    >>> block["norm"](torch.ones(2, 3, 4)).placements        # (batch, sequence, hidden): still Shard(1)
    (Shard(dim=1),)
    """

    owns_parameters = True

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False, uneven_shards: bool = False):
        if not isinstance(sequence_dim, int) or isinstance(sequence_dim, bool):
            raise TypeError(f"SequenceParallel(sequence_dim={sequence_dim!r}): expected an int, e.g. 1")
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = check_flag(use_local_output, "use_local_output", "SequenceParallel")
        self.uneven_shards = check_flag(uneven_shards, "uneven_shards", "SequenceParallel")

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        seq, uneven, use_local = self.sequence_sharding[0], self.uneven_shards, self.use_local_output

        def partition(name, mod, mesh):
            for n, p in list(mod.named_parameters(recurse=False)):
                dt = DTensor.from_local(p.detach(), mesh, [Replicate()])
                mod.register_parameter(n, nn.Parameter(dt, requires_grad=p.requires_grad))

        def input_fn(mod, args, mesh):
            if not args or not isinstance(args[0], torch.Tensor):
                raise ValueError(f"SequenceParallel: {type(mod).__name__} expects a tensor as its first input, "
                                 f"got {type(args[0]).__name__ if args else 'no inputs'}")
            return (to_dtensor(args[0], mesh, seq, seq, uneven),) + tuple(args[1:])

        def output_fn(mod, output, mesh):
            return from_dtensor(output, mesh, None, use_local)

        return distribute_module(module, device_mesh, partition, input_fn, output_fn)
