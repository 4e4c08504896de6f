"""``parallelize_module``: apply tensor-parallel styles to the submodules a plan names."""

from __future__ import annotations

from fnmatch import fnmatchcase
import warnings
from typing import Optional, Union

from torch import nn

from shardwise.tensor import DTensor
from shardwise.tensor.distribute import current_mesh

from .style import ParallelStyle

__all__ = ["parallelize_module"]


def _matches(pattern: str, name: str) -> bool:
    """Glob match per dotted atom: ``layers.*.mlp`` matches ``layers.0.mlp``, not ``layers.0.x.mlp``."""
    p, n = pattern.split(".") if pattern else [], name.split(".") if name else []
    return len(p) == len(n) and all(fnmatchcase(a, b) for a, b in zip(n, p))


def _resolve(module: nn.Module, plan: dict) -> list[tuple[str, nn.Module, ParallelStyle]]:
    targets = []
    modules = list(module.named_modules())
    for pattern, style in plan.items():
        if not isinstance(pattern, str):
            raise TypeError(f"parallelize_module: plan key {pattern!r} must be a module name (str), e.g. 'layers.*.mlp'")
        if not isinstance(style, ParallelStyle):
            raise TypeError(
                f"parallelize_module: plan[{pattern!r}] is {type(style).__name__}, not a ParallelStyle; "
                "use ColwiseParallel(), RowwiseParallel(), SequenceParallel() or PrepareModuleInput/Output(...)"
            )
        found = [(n, m) for n, m in modules if _matches(pattern, n)]
        if not found:
            sample = ", ".join(repr(n) for n, _ in modules[1:6])
            raise ValueError(
                f"parallelize_module: plan key {pattern!r} matches no submodule of {type(module).__name__} "
                f"(names look like {sample}); fix the key"
            )
        for n, m in found:
            style.check(n, m)
            targets.append((n, m, style))
    _check_once(targets)
    return targets


def _check_once(targets) -> None:
    """A module's parameters can be distributed once: one parameter-owning style per module."""
    owner: dict = {}
    for name, mod, style in targets:
        if not style.owns_parameters:
            continue
        if getattr(mod, "_distribute_module_applied", False) or any(
                isinstance(p, DTensor) for p in mod.parameters(recurse=False)):
            raise ValueError(
                f"parallelize_module: {name!r} already has DTensor parameters (parallelized before); "
                "parallelize a fresh module or drop it from the plan"
            )
        if id(mod) in owner:
            raise ValueError(
                f"parallelize_module: {name!r} gets two parameter-sharding styles ({type(owner[id(mod)]).__name__}"
                f" and {type(style).__name__}), e.g. from overlapping globs; give each module one"
            )
        owner[id(mod)] = style


def parallelize_module(module: nn.Module, device_mesh=None,
                       parallelize_plan: Union[ParallelStyle, dict, None] = None, *,
                       src_data_rank: Optional[int] = 0) -> nn.Module:
    """Parallelize ``module`` in place on a 1-D mesh and return it (torch's signature).

    ``parallelize_plan`` is one style (for ``module`` itself) or a dict mapping submodule names (globs
    per dotted atom allowed, ``""`` is the root) to styles. Every entry is validated before any module
    is changed; a key that matches nothing is an error (torch warns and skips it). ``device_mesh=None``
    takes the mesh of the enclosing ``with mesh:`` block. ``src_data_rank``: the mesh rank whose
    parameter values every rank gets (None: each rank keeps its own, no communication).

    >>> import torch; from shardwise.parallel import ColwiseParallel, RowwiseParallel
    >>> from shardwise.tensor import init_device_mesh
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    >>> mesh = init_device_mesh("cpu", (1,))               # (3,) under torchrun with 3 ranks
    >>> model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    >>> model[0].weight.placements, model[2].weight.placements, model(torch.ones(2, 4)).shape
    ((Shard(dim=0),), (Shard(dim=1),), torch.Size([2, 4]))
    """
    if device_mesh is None:
        device_mesh = current_mesh("parallelize_module")
    if parallelize_plan is None:
        warnings.warn("parallelize_module: no parallelize_plan given, the module is left as it is", stacklevel=2)
        return module
    if device_mesh.ndim != 1:
        raise ValueError(
            f"parallelize_module: the mesh has {device_mesh.ndim} dimensions; tensor-parallel styles take a "
            "1-D mesh, e.g. mesh['tp'] of a 2-D mesh"
        )
    if src_data_rank is not None and not (isinstance(src_data_rank, int) and 0 <= src_data_rank < device_mesh.size()):
        raise ValueError(f"parallelize_module(src_data_rank={src_data_rank!r}): must be a rank of the mesh "
                         f"(0..{device_mesh.size() - 1}) or None")
    plan = parallelize_plan if isinstance(parallelize_plan, dict) else {"": parallelize_plan}
    for name, mod, style in _resolve(module, plan):
        style.src_data_rank = src_data_rank  # as torch: the style reads it while distributing
        style._apply(mod, device_mesh)
    return module
