"""``distribute_module``: turn a module's parameters into DTensors and lay out its inputs and outputs.

Same name, signature and semantics as ``torch.distributed.tensor.distribute_module``: a
``partition_fn(name, submodule, mesh)`` distributes what it wants, every parameter and buffer left
plain is then replicated, and ``input_fn(module, inputs, mesh)`` / ``output_fn(module, outputs, mesh)``
become forward pre- and post-hooks. The tensor-parallel styles in ``shardwise.parallel`` are built on it.

>>> def shard_rows(name, mod, mesh):                                             # doctest: +SKIP
...     for n, p in list(mod.named_parameters(recurse=False)):
...         mod.register_parameter(n, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))
>>> emb = distribute_module(nn.Embedding(16, 8), mesh, shard_rows)               # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Optional

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .dtensor import DTensor, distribute_tensor
from .placements import Replicate

__all__ = ["distribute_module"]

_APPLIED = "_distribute_module_applied"  # torch's attribute name: a module torch marked is refused too


def current_mesh(what: str) -> DeviceMesh:
    """The mesh of the innermost ``with mesh:`` block (torch's DeviceMesh is a context manager)."""
    from torch.distributed.device_mesh import _mesh_resources

    stack = getattr(_mesh_resources, "mesh_stack", [])
    if not stack:
        raise ValueError(f"{what}: device_mesh is None and no `with mesh:` block is active; pass the mesh, "
                         "e.g. init_device_mesh('cpu', (world_size,))")
    return stack[-1]


def _arity(fn, what: str) -> Optional[int]:
    """Number of parameters of a hook function (2: the deprecated (inputs, mesh) form; 3: torch's)."""
    if fn is None:
        return None
    if not callable(fn):
        raise TypeError(f"distribute_module({what}={fn!r}): expected a function taking (module, {what[:-3]}s, "
                        "device_mesh), or None")
    n = len(inspect.signature(fn).parameters)
    if n not in (2, 3):
        raise ValueError(f"distribute_module: {what} takes {n} arguments; it must take 3 (module, "
                         f"{what[:-3]}s, device_mesh), e.g. `def {what}(mod, {what[:-3]}s, mesh): ...`")
    if n == 2:
        warnings.warn(f"distribute_module: a {what} taking ({what[:-3]}s, device_mesh) is deprecated (as in "
                      f"torch); take (module, {what[:-3]}s, device_mesh)", FutureWarning, stacklevel=3)
    return n


def _replicate_rest(mod: nn.Module, mesh: DeviceMesh) -> None:
    """Replicate the module's own parameters and buffers that are still plain tensors (the data of the
    mesh's first rank wins, as with ``distribute_tensor``'s default ``src_data_rank=0``)."""
    full = [Replicate()] * mesh.ndim
    for key, param in list(mod._parameters.items()):
        if param is not None and not isinstance(param, DTensor):
            dt = distribute_tensor(param.detach(), mesh, full)
            mod.register_parameter(key, nn.Parameter(dt, requires_grad=param.requires_grad))
    for key, buf in list(mod._buffers.items()):
        if buf is not None and not isinstance(buf, DTensor):
            mod._buffers[key] = distribute_tensor(buf, mesh, full)


def distribute_module(
    module: nn.Module,
    device_mesh: Optional[DeviceMesh] = None,
    partition_fn: Optional[Callable[[str, nn.Module, DeviceMesh], None]] = None,
    input_fn: Optional[Callable[[nn.Module, Any, DeviceMesh], Any]] = None,
    output_fn: Optional[Callable[[nn.Module, Any, DeviceMesh], Any]] = None,
) -> nn.Module:
    """Distribute ``module`` in place over ``device_mesh`` (default: the mesh of the enclosing
    ``with mesh:`` block) and return it.

    ``partition_fn(name, submodule, mesh)`` runs on every submodule (``named_modules()`` order) and may
    replace parameters with DTensor parameters; then every parameter and buffer still plain is
    replicated (all of them when ``partition_fn`` is None). ``input_fn(module, inputs, mesh)`` runs as a
    forward pre-hook (its result replaces the inputs), ``output_fn(module, outputs, mesh)`` as a forward
    hook (its result replaces the outputs). A module is distributed once; a second call raises
    ``RuntimeError`` like torch's. Meta-device modules work (no collective); ``to_empty`` then
    materializes the local pieces.

    >>> def shard_rows(name, mod, mesh):                                             # doctest: +SKIP
    ...     for n, p in list(mod.named_parameters(recurse=False)):
    ...         mod.register_parameter(n, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))
    >>> emb = distribute_module(nn.Embedding(16, 8), mesh, shard_rows,
    ...                         input_fn=lambda mod, inputs, mesh: DTensor.from_local(inputs[0], mesh, [Replicate()]),
    ...                         output_fn=lambda mod, out, mesh: out.full_tensor())  # doctest: +SKIP
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"distribute_module expects an nn.Module, got {type(module).__name__}")
    if getattr(module, _APPLIED, False):
        raise RuntimeError(f"distribute_module: this {type(module).__name__} was distributed already; a module "
                           "is distributed once (build a fresh module, or distribute a copy made before)")
    mesh = device_mesh if device_mesh is not None else current_mesh("distribute_module")
    if partition_fn is not None and not callable(partition_fn):
        raise TypeError(f"distribute_module(partition_fn={partition_fn!r}): expected a function taking "
                        "(name, submodule, device_mesh), or None")
    n_in, n_out = _arity(input_fn, "input_fn"), _arity(output_fn, "output_fn")
    for name, sub in list(module.named_modules()):
        if partition_fn is not None:
            partition_fn(name, sub, mesh)
        _replicate_rest(sub, mesh)
    if input_fn is not None:
        if n_in == 2:
            module.register_forward_pre_hook(lambda mod, inputs: input_fn(inputs, mesh))
        else:
            module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, mesh))
    if output_fn is not None:
        if n_out == 2:
            module.register_forward_hook(lambda mod, inputs, outputs: output_fn(outputs, mesh))
        else:
            module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, mesh))
    setattr(module, _APPLIED, True)
    return module
