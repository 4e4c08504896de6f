"""Styles that only lay out a module's inputs or outputs: ``PrepareModuleInput``, ``PrepareModuleOutput``
and ``PrepareModuleInputOutput`` (torch's names and arguments).

For each tensor a pair of layouts: the layout a plain tensor is in (it is wrapped as this rank's
piece; None: leave it alone) and the layout wanted (a redistribute; None: as is). Plain pieces are
taken to be even unless ``uneven_shards=True`` (see _layout.py).

>>> import torch; from shardwise.tensor import Replicate, Shard, init_device_mesh
>>> from shardwise.parallel import PrepareModuleInput, PrepareModuleOutput, parallelize_module
>>> mesh = init_device_mesh("cpu", (1,))
>>> m = parallelize_module(torch.nn.Identity(), mesh, PrepareModuleInput(input_layouts=(Shard(0),),
...                                                                       desired_input_layouts=(Replicate(),)))
>>> m(torch.ones(2)).placements         # the input: this rank's piece of a Shard(0) tensor, gathered
(Replicate(),)
>>> style = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
>>> parallelize_module(torch.nn.Identity(), mesh, style)(torch.ones(4, 2)).shape   # this rank's rows
torch.Size([4, 2])
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from shardwise.tensor import DTensor

from ._layout import as_layouts, check_flag, check_placement, to_dtensor
from .style import ParallelStyle

__all__ = ["PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput"]


def _pairs(given, desired, what: str, style: str) -> tuple[Optional[tuple], Optional[tuple]]:
    src = as_layouts(given, f"{what}_layouts", style)
    dst = as_layouts(desired, f"desired_{what}_layouts", style)
    if src is not None and (dst is None or len(src) != len(dst)):
        n = "None" if dst is None else f"{len(dst)} entries"
        raise ValueError(
            f"{style}: {what}_layouts has {len(src)} entries but desired_{what}_layouts has {n}; "
            f"give one entry (or None) per {what} in both, e.g. {what}_layouts=(Shard(0), None), "
            f"desired_{what}_layouts=(Replicate(), None)"
        )
    return src, dst


class PrepareModuleInput(ParallelStyle):
    """Lay out a module's inputs before its forward: positional ``input_layouts`` (one entry per
    argument, None = leave it; None altogether = leave all positional arguments) are redistributed
    to ``desired_input_layouts``; keyword arguments likewise through the ``*_kwarg_layouts`` dicts.
    ``use_local_output=True`` hands the module local tensors.

    >>> import torch; from shardwise.tensor import Replicate, Shard, init_device_mesh
    >>> from shardwise.parallel import parallelize_module
    >>> style = PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),))
    >>> parallelize_module(torch.nn.Identity(), init_device_mesh("cpu", (1,)), style)(torch.ones(2)).placements
    (Replicate(),)
    """

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts: Optional[dict] = None,
                 desired_input_kwarg_layouts: Optional[dict] = None, use_local_output: bool = False,
                 uneven_shards: bool = False):
        name = "PrepareModuleInput"
        self.input_layouts, self.desired_input_layouts = _pairs(input_layouts, desired_input_layouts, "input", name)
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        extra = sorted(set(self.desired_input_kwarg_layouts) - set(self.input_kwarg_layouts))
        if extra:
            raise ValueError(
                f"PrepareModuleInput: desired_input_kwarg_layouts names {extra} missing from input_kwarg_layouts; "
                "give both layouts for each keyword argument"
            )
        for k, p in list(self.input_kwarg_layouts.items()) + list(self.desired_input_kwarg_layouts.items()):
            check_placement(p, f"input_kwarg_layouts[{k!r}]", name)
        self.use_local_output = check_flag(use_local_output, "use_local_output", name)
        self.uneven_shards = check_flag(uneven_shards, "uneven_shards", name)

    def _convert(self, x, mesh, src, dst):
        x = to_dtensor(x, mesh, src, dst, self.uneven_shards)
        return x.to_local() if self.use_local_output and isinstance(x, DTensor) else x

    def _prepare(self, mod, args: tuple, kwargs: dict, mesh) -> tuple[tuple, dict]:
        if self.input_layouts is not None:
            if len(args) != len(self.input_layouts):
                raise ValueError(
                    f"PrepareModuleInput: {type(mod).__name__} got {len(args)} positional inputs but input_layouts "
                    f"has {len(self.input_layouts)} entries; module inputs and input_layouts must have the same "
                    "length (pass None for an argument to leave alone)"
                )
            args = tuple(self._convert(a, mesh, s, d) if s is not None else a
                         for a, s, d in zip(args, self.input_layouts, self.desired_input_layouts))
        kw_in, kw_want = self.input_kwarg_layouts, self.desired_input_kwarg_layouts
        kwargs = {k: self._convert(v, mesh, kw_in[k], kw_want.get(k)) if kw_in.get(k) is not None else v
                  for k, v in kwargs.items()}
        return args, kwargs

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        module.register_forward_pre_hook(
            lambda mod, args, kwargs: self._prepare(mod, args, kwargs, device_mesh), with_kwargs=True)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Lay out a module's outputs after its forward: each output (a tuple entry, or the single output)
    that is a plain tensor is wrapped as its ``output_layouts`` entry, then redistributed to the
    ``desired_output_layouts`` entry; None entries are left alone. ``use_local_output=True`` (default)
    returns local tensors.

    >>> import torch; from shardwise.tensor import Replicate, Shard, init_device_mesh
    >>> from shardwise.parallel import parallelize_module
    >>> style = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0), use_local_output=False)
    >>> parallelize_module(torch.nn.Identity(), init_device_mesh("cpu", (1,)), style)(torch.ones(4, 2)).placements
    (Shard(dim=0),)
    """

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output: bool = True,
                 uneven_shards: bool = False):
        name = "PrepareModuleOutput"
        if output_layouts is None:
            raise ValueError("PrepareModuleOutput: output_layouts is required, e.g. output_layouts=Replicate()")
        self.output_layouts, self.desired_output_layouts = _pairs(output_layouts, desired_output_layouts,
                                                                  "output", name)
        self.use_local_output = check_flag(use_local_output, "use_local_output", name)
        self.uneven_shards = check_flag(uneven_shards, "uneven_shards", name)

    def _prepare(self, mod, outputs, mesh):
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if len(outs) != len(self.output_layouts):
            raise ValueError(
                f"PrepareModuleOutput: {type(mod).__name__} returned {len(outs)} outputs but output_layouts has "
                f"{len(self.output_layouts)} entries; module outputs and output_layouts must have the same length"
            )
        done = []
        for x, src, dst in zip(outs, self.output_layouts, self.desired_output_layouts):
            if src is not None:
                x = to_dtensor(x, mesh, src, dst, self.uneven_shards)
                x = x.to_local() if self.use_local_output and isinstance(x, DTensor) else x
            done.append(x)
        return done[0] if len(done) == 1 else tuple(done)

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        module.register_forward_hook(lambda mod, inputs, outputs: self._prepare(mod, outputs, device_mesh))
        return module


class PrepareModuleInputOutput(ParallelStyle):
    """``PrepareModuleInput`` and ``PrepareModuleOutput`` on one module (``use_local_input`` is the
    input half's ``use_local_output``).

    >>> import torch; from shardwise.tensor import Replicate, Shard, init_device_mesh
    >>> from shardwise.parallel import parallelize_module
    >>> style = PrepareModuleInputOutput(input_layouts=Shard(0), desired_input_layouts=Replicate(),
    ...                                  output_layouts=Replicate(), desired_output_layouts=Shard(0))
    >>> parallelize_module(torch.nn.Identity(), init_device_mesh("cpu", (1,)), style)(torch.ones(4, 2)).shape
    torch.Size([4, 2])
    """

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_input: bool = False, output_layouts,
                 desired_output_layouts, use_local_output: bool = True, uneven_shards: bool = False):
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input, uneven_shards=uneven_shards)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output, uneven_shards=uneven_shards)

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        self.prepare_module_input._apply(module, device_mesh)
        return self.prepare_module_output._apply(module, device_mesh)
