"""Which device a rank computes on, and which backend talks for it.

The device always follows the mesh (``mesh.device_type``) plus this process's local index
(``LOCAL_RANK``, else the current device), never a backend name: ``"cpu:gloo,cuda:nccl"`` is one
backend string serving two devices. The backend follows the device (NCCL for CUDA, gloo for CPU).

Example::

    mesh = init_device_mesh("cuda", (2,))
    x = torch.zeros(4, device=mesh_device(mesh))   # cuda:<LOCAL_RANK>
    backend_for("cuda")                            # "nccl"
"""
from __future__ import annotations

import os

import torch

__all__ = ["backend_for", "default_group_device_type", "default_mesh", "local_device", "mesh_device"]

_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def backend_for(device_type: str) -> str:
    """The collective backend for ``device_type``: ``"gloo"`` for CPU, ``"nccl"`` for CUDA."""
    try:
        return _BACKENDS[device_type]
    except KeyError:
        raise ValueError(
            f"device type {device_type!r} has no known collective backend; use one of {sorted(_BACKENDS)}"
        ) from None


def local_device(device_type: str) -> torch.device:
    """This process's device of ``device_type``: index ``LOCAL_RANK`` if set, else the current one."""
    if device_type == "cpu":
        return torch.device("cpu")
    module = getattr(torch, device_type)
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None:
        index, count = int(local_rank), module.device_count()
        # CUDA_VISIBLE_DEVICES may show each process only its own GPU(s): then LOCAL_RANK is no index
        return torch.device(device_type, module.current_device() if 0 < count <= index else index)
    return torch.device(device_type, module.current_device())


def mesh_device(mesh) -> torch.device:
    """The device this rank's pieces of ``mesh`` live on (``torch.device(mesh.device_type)`` would
    mean ``cuda:current`` for CUDA, which need not be this rank's GPU)."""
    return local_device(mesh.device_type)


def default_group_device_type() -> str:
    """``"cuda"`` when the default process group can talk for CUDA tensors and this process has a GPU,
    else ``"cpu"``; read from the group's devices, not from its backend name."""
    import torch.distributed as dist

    group = dist.distributed_c10d._get_default_group()
    types = {d.type if isinstance(d, torch.device) else str(d) for d in getattr(group, "_device_types", ())}
    return "cuda" if "cuda" in types and torch.cuda.is_available() else "cpu"


def default_mesh(who: str):
    """A 1-D mesh over every rank of the default process group, on its device (see above).

    ``who`` names the caller in the error raised when no process group exists yet.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{who}: mesh=None means all ranks of the default process group, but torch.distributed is not "
            "initialized; call torch.distributed.init_process_group() first (torchrun sets it up), or pass mesh="
        )
    return init_device_mesh(default_group_device_type(), (dist.get_world_size(),))
