"""``distribute_tensor`` (lay a full tensor out over a mesh) and ``distribute_module`` (turn a module's
parameters into DTensors and lay out its inputs and outputs).

``distribute_module`` has the same name, signature and semantics as torch's: a

``partition_fn(name, submodule, mesh)`` distributes what it wants, every parameter and buffer left
plain is then replicated, and ``input_fn(module, inputs, mesh)`` / ``output_fn(module, outputs, mesh)``
become forward pre- and post-hooks. The tensor-parallel styles in ``shardwise.parallel`` are built on it.

>>> from shardwise.tensor import Shard, distribute_module, distribute_tensor, init_device_mesh
>>> def shard_rows(name, mod, mesh):
...     for n, p in list(mod.named_parameters(recurse=False)):
...         mod.register_parameter(n, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))
>>> emb = distribute_module(nn.Embedding(16, 8), init_device_mesh("cpu", (1,)), shard_rows)
>>> emb.weight.placements
(Shard(dim=0),)
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .collectives import mesh_broadcast_
from .dtensor import DTensor
from .checks.layout import check_distribute_call
from .placements import Partial, Placement, Replicate, Shard
from .redistribute import to_partial
from .spec import DTensorSpec, _contiguous_stride, chunk_range, coord_or_none, mesh_coord, mesh_or_current, \
    normalize_placements

__all__ = ["distribute_tensor", "distribute_module"]

_APPLIED = "_distribute_module_applied"  # torch's attribute name: a module torch marked is refused too


def distribute_tensor(
    tensor: torch.Tensor, device_mesh: Optional[DeviceMesh] = None, placements: Sequence[Placement] = None, *,
    src_data_rank: Optional[int] = 0
) -> DTensor:
    """Lay out a full tensor over the mesh. With ``src_data_rank=k`` (default 0) all ranks first check they
    pass the same shape, dtype and placements, then the data of the mesh's k-th rank (row-major in
    ``mesh.mesh``) is broadcast so every rank agrees; ``None`` trusts each rank's copy (no communication).
    Both use the mesh's own per-dimension groups: a sub-mesh of an N-D mesh creates no process group.
    A meta tensor gives a meta DTensor holding this rank's local shape, with no communication.
    ``device_mesh=None`` takes the mesh of the innermost ``with mesh:`` block (as PyTorch's).

    >>> from shardwise.tensor import init_device_mesh
    >>> mesh = init_device_mesh("cpu", (1,))                       # (2,) on 2 ranks: 4 rows each
    >>> w = distribute_tensor(torch.arange(8.0).view(8, 1), mesh, [Shard(0)])   # rank 0's values
    >>> w.to_local().flatten().tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    """
    if isinstance(tensor, DTensor):
        raise TypeError("distribute_tensor got a DTensor; use .redistribute(mesh, placements) instead")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"distribute_tensor expects a torch.Tensor, got {type(tensor).__name__}; pass torch.tensor(...)")
    device_mesh = mesh_or_current(device_mesh, "distribute_tensor")
    meta = tensor.device.type == "meta"  # shapes only: a meta DTensor, with no collective (as torch's)
    if placements is None:
        placements = [Replicate()] * device_mesh.ndim
    if coord_or_none(device_mesh) is None:  # PyTorch's rule: a rank outside the mesh holds an empty piece
        placements = normalize_placements(placements, device_mesh.ndim, tensor.ndim)
        spec = DTensorSpec(device_mesh, placements, tensor.shape, _contiguous_stride(tensor.shape), tensor.dtype)
        local = tensor.detach().new_empty(0, device=torch.device(device_mesh.device_type))
        return DTensor(local, spec, requires_grad=tensor.requires_grad)
    if src_data_rank is None or meta:
        placements = normalize_placements(placements, device_mesh.ndim, tensor.ndim)
    else:  # every rank raises the same error when ranks disagree, before the data moves
        placements, src_coord = check_distribute_call(tensor, placements, device_mesh, src_data_rank)
    device = torch.device(device_mesh.device_type)
    local = tensor.detach()
    if local.device.type != device.type and not meta:
        local = local.to(device)
    if src_data_rank is not None and not meta:
        local = mesh_broadcast_(local.contiguous().clone(), device_mesh, src_coord)
    coord = mesh_coord(device_mesh)
    mesh_shape = tuple(device_mesh.shape)
    for mdim, p in enumerate(placements):
        if type(p) is Shard:
            start, length = chunk_range(local.shape[p.dim], mesh_shape[mdim], coord[mdim])
            local = local.narrow(p.dim, start, length)
        elif isinstance(p, Partial):
            local = to_partial(local, p.collective_op, coord[mdim])
    local = local.contiguous() if src_data_rank is None else local.clone().contiguous()
    spec = DTensorSpec(device_mesh, placements, tensor.shape, _contiguous_stride(tensor.shape), tensor.dtype)
    return DTensor(local, spec, requires_grad=tensor.requires_grad)


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

    >>> from shardwise.tensor import init_device_mesh
    >>> def shard_rows(name, mod, mesh):
    ...     for n, p in list(mod.named_parameters(recurse=False)):
    ...         mod.register_parameter(n, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))
    >>> emb = distribute_module(nn.Embedding(16, 8), init_device_mesh("cpu", (1,)), shard_rows,
    ...                         input_fn=lambda mod, inputs, mesh: DTensor.from_local(inputs[0], mesh, [Replicate()]),
    ...                         output_fn=lambda mod, out, mesh: out.full_tensor())
    >>> emb(torch.tensor([1, 15])).shape          # a plain tensor out: output_fn gathered it
    torch.Size([2, 8])
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
