"""Tensor-parallel styles: how one module's parameters, inputs and outputs are laid out on a 1-D mesh.

A style distributes the module's parameters as DTensors and installs forward hooks that lay out
inputs (plain tensors are wrapped with their true global shape, so uneven ``torch.chunk`` shards work
on any world size) and outputs. The module's own ``forward`` then runs per-op on DTensors.

>>> plan = {"emb": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}  # doctest: +SKIP
>>> parallelize_module(model, mesh, plan)                                                   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from shardwise.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from shardwise.tensor.collectives import all_reduce

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "PrepareModuleInput"]


def _check_placement(value, what: str, style: str) -> Optional[Placement]:
    if value is None or isinstance(value, Placement):
        return value
    raise TypeError(
        f"{style}({what}={value!r}): expected one Placement for the 1-D tensor-parallel mesh, "
        "e.g. Shard(-1) or Replicate()"
    )


def _global_shape(x: torch.Tensor, mesh, placement: Placement, known: dict) -> list[int]:
    """Global shape of a local piece laid out as ``placement``; ``known`` maps dims to global sizes
    the module fixes (a Linear's features); other sharded dims are summed over the mesh."""
    shape = list(x.shape)
    if type(placement) is Shard:
        d = placement.dim % x.ndim
        if d in known or d - x.ndim in known:
            shape[d] = known.get(d, known.get(d - x.ndim))
        else:  # uneven shards make the size ambiguous: ask the other ranks (one tiny all-reduce)
            size = torch.tensor([x.shape[d]], dtype=torch.long, device=x.device)
            shape[d] = int(all_reduce(size, "sum", mesh, 0).item())
    return shape


def to_dtensor(x, mesh, src: Placement, dst: Optional[Placement], known: Optional[dict] = None):
    """Lay out a module input: a plain tensor is this rank's piece laid out as ``src``; a DTensor keeps
    its own layout. Either is then redistributed to ``dst`` (None: leave as is)."""
    if not isinstance(x, torch.Tensor):
        return x
    if not isinstance(x, DTensor):
        if src is None:
            return x
        shape = _global_shape(x, mesh, src, known or {})
        x = DTensor.from_local(x, mesh, [src], shape=shape)
    if dst is not None and x.placements != (dst,):
        x = x.redistribute(mesh, [dst])
    return x


def from_dtensor(x, mesh, dst: Optional[Placement], use_local: bool):
    if not isinstance(x, DTensor):
        return x
    if dst is not None and x.placements != (dst,):
        x = x.redistribute(mesh, [dst])
    return x.to_local() if use_local else x


class ParallelStyle:
    """Base of the styles: ``apply(module, mesh)`` parallelizes one module in place."""

    supported: tuple = ()

    def apply(self, module: nn.Module, mesh) -> nn.Module:
        raise NotImplementedError

    def check(self, name: str, module: nn.Module) -> None:
        """Raise before anything is changed when this style cannot parallelize ``module``."""
        if self.supported and not isinstance(module, self.supported):
            kinds = ", ".join(t.__name__ for t in self.supported)
            raise TypeError(
                f"{type(self).__name__} cannot parallelize module {name!r} of type {type(module).__name__}; "
                f"it supports {kinds}. Map {name!r} to another style or to a submodule of a supported type"
            )


def _distribute_params(module: nn.Module, mesh, placements: dict) -> None:
    for name, param in list(module.named_parameters(recurse=False)):
        pl = placements.get(name, Replicate())
        dt = distribute_tensor(param.detach(), mesh, [pl])
        module.register_parameter(name, nn.Parameter(dt, requires_grad=param.requires_grad))


class _TPStyle(ParallelStyle):
    supported = (nn.Linear, nn.Embedding)

    def __init__(self, *, input_layouts: Placement = None, output_layouts: Placement = None,
                 use_local_output: bool = True):
        name = type(self).__name__
        self.input_layouts = _check_placement(input_layouts, "input_layouts", name)
        self.output_layouts = _check_placement(output_layouts, "output_layouts", name)
        if not isinstance(use_local_output, bool):
            raise TypeError(f"{name}(use_local_output={use_local_output!r}): pass True or False")
        self.use_local_output = use_local_output

    def _layouts(self, module) -> tuple[Placement, Placement, Placement, dict]:
        """(input layout, layout the computation needs, output layout, parameter placements)."""
        raise NotImplementedError

    def apply(self, module: nn.Module, mesh) -> nn.Module:
        src, want, out, params = self._layouts(module)
        known = {-1: module.in_features} if isinstance(module, nn.Linear) else {}
        _distribute_params(module, mesh, params)
        use_local = self.use_local_output

        def pre_hook(mod, args):
            return (to_dtensor(args[0], mesh, src, want, known),) + tuple(args[1:])

        def post_hook(mod, args, output):
            return from_dtensor(output, mesh, out, use_local)

        module.register_forward_pre_hook(pre_hook)
        module.register_forward_hook(post_hook)
        return module


class ColwiseParallel(_TPStyle):
    """Shard a Linear's output features (weight and bias ``Shard(0)``) or an Embedding's columns
    (``Shard(1)``). Input: ``Replicate()`` by default; output: ``Shard(-1)`` by default.

    >>> parallelize_module(model, mesh, {"up": ColwiseParallel()})  # doctest: +SKIP
    """

    def _layouts(self, module):
        src = self.input_layouts or Replicate()
        out = self.output_layouts or Shard(-1)
        if isinstance(module, nn.Linear):
            return src, Replicate(), out, {"weight": Shard(0), "bias": Shard(0)}
        return src, Replicate(), out, {"weight": Shard(1)}


class RowwiseParallel(_TPStyle):
    """Shard a Linear's input features (weight ``Shard(1)``, bias replicated; input ``Shard(-1)`` by
    default) or an Embedding's rows (``Shard(0)``; replicated ids). The partial result is reduced to
    ``output_layouts``: ``Replicate()`` by default (one all-reduce) or e.g. ``Shard(1)`` for a
    sequence-sharded output (one reduce-scatter). Uneven shards (e.g. 10 rows on 3 ranks) work.

    >>> parallelize_module(model, mesh, {"emb": RowwiseParallel(output_layouts=Shard(1))})  # doctest: +SKIP
    """

    def _layouts(self, module):
        out = self.output_layouts or Replicate()
        if isinstance(module, nn.Linear):
            src = self.input_layouts or Shard(-1)
            return src, Shard(-1), out, {"weight": Shard(1), "bias": Replicate()}
        return self.input_layouts or Replicate(), Replicate(), out, {"weight": Shard(0)}


class PrepareModuleInput(ParallelStyle):
    """Lay out a module's inputs before its forward: positional ``input_layouts`` (one entry per
    argument, None = leave it) are redistributed to ``desired_input_layouts``; keyword arguments
    likewise through the ``*_kwarg_layouts`` dicts.

    >>> PrepareModuleInput(input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(), None))  # doctest: +SKIP
    """

    def __init__(self, *, input_layouts: Sequence = (), desired_input_layouts: Sequence = (),
                 input_kwarg_layouts: Optional[dict] = None, desired_input_kwarg_layouts: Optional[dict] = None,
                 use_local_output: bool = False):
        one = lambda v: (v,) if isinstance(v, Placement) or v is None else tuple(v)  # noqa: E731
        self.input_layouts, self.desired = one(input_layouts), one(desired_input_layouts)
        if len(self.input_layouts) != len(self.desired):
            raise ValueError(
                f"PrepareModuleInput: input_layouts has {len(self.input_layouts)} entries but "
                f"desired_input_layouts has {len(self.desired)}; give one entry (or None) per argument"
            )
        self.kw = dict(input_kwarg_layouts or {})
        self.kw_desired = dict(desired_input_kwarg_layouts or {})
        if set(self.kw_desired) - set(self.kw):
            raise ValueError(
                f"PrepareModuleInput: desired_input_kwarg_layouts names {sorted(set(self.kw_desired) - set(self.kw))} "
                "missing from input_kwarg_layouts; give both layouts for each keyword argument"
            )
        for i, p in enumerate(self.input_layouts + self.desired + tuple(self.kw.values())):
            _check_placement(p, "layouts", "PrepareModuleInput")
        self.use_local_output = use_local_output

    def _convert(self, x, mesh, src, dst):
        x = to_dtensor(x, mesh, src, dst)
        return x.to_local() if self.use_local_output and isinstance(x, DTensor) else x

    def apply(self, module: nn.Module, mesh) -> nn.Module:
        def pre_hook(mod, args, kwargs):
            if any(s is not None for s in self.input_layouts[len(args):]):
                raise ValueError(
                    f"PrepareModuleInput: {type(mod).__name__} got {len(args)} positional inputs but "
                    f"input_layouts describes {len(self.input_layouts)}; pass None for arguments to leave"
                )
            new = [self._convert(a, mesh, s, d) if s is not None else a
                   for a, s, d in zip(args, self.input_layouts, self.desired)]
            kwargs = {k: self._convert(v, mesh, self.kw[k], self.kw_desired.get(k)) if k in self.kw else v
                      for k, v in kwargs.items()}
            return tuple(new) + tuple(args[len(new):]), kwargs

        module.register_forward_pre_hook(pre_hook, with_kwargs=True)
        return module
