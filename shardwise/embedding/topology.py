"""Who is where: process group, rank, device and host grouping for a sharded collection
(:class:`MeshTopology`; TorchRec's planner ``Topology`` is :class:`shardwise.embedding.plan.Topology`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from .._device import default_mesh, local_device

__all__ = ["MeshTopology"]


def _device_for(device_type: str) -> torch.device:
    # this rank's device of the mesh's type: cuda:LOCAL_RANK, never a guess from the backend name
    return local_device(device_type)


@dataclass(frozen=True)
class MeshTopology:
    """Process group + the mesh it came from; ``hosts`` lists the ranks of each host (row of a 2-D mesh).

    Ranks here are ranks within ``group``.
    """

    group: Any
    mesh: Any
    rank: int
    world_size: int
    device: torch.device
    hosts: tuple
    host_group: Any = None      # the ranks of this rank's host (row of a 2-D mesh), None on 1-D
    peer_group: Any = None      # the ranks with this rank's local index on every host, None on 1-D

    @staticmethod
    def from_mesh(mesh: Optional[Any]) -> "MeshTopology":
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("shard() needs an initialised torch.distributed process group; "
                               "call dist.init_process_group first")
        if mesh is None:
            mesh = default_mesh("shard()")
        if not hasattr(mesh, "ndim") or not hasattr(mesh, "device_type"):
            raise TypeError(f"mesh must be a torch DeviceMesh, got {type(mesh).__name__}")
        ranks = mesh.mesh.flatten().tolist()
        if mesh.ndim == 1:
            group = mesh.get_group()
        elif mesh.ndim == 2:
            if ranks != list(range(dist.get_world_size())):
                raise ValueError(f"a 2-D mesh (hosts x ranks per host) must cover ranks 0..world-1 in order, "
                                 f"got {ranks}; build it with init_device_mesh(type, (hosts, per_host))")
            group = dist.group.WORLD
        else:
            raise ValueError(f"mesh must be 1-D (ranks) or 2-D (hosts x ranks per host), got {mesh.ndim}-D")
        # Group ranks are positions in the flattened mesh, so host rows translate directly.
        pos = {g: i for i, g in enumerate(ranks)}
        rows = mesh.mesh.tolist() if mesh.ndim == 2 else [ranks]
        hosts = tuple(tuple(pos[g] for g in row) for row in rows)
        host_group = mesh.get_group(1) if mesh.ndim == 2 else None
        peer_group = mesh.get_group(0) if mesh.ndim == 2 else None
        return MeshTopology(group=group, mesh=mesh, rank=dist.get_rank(group), world_size=len(ranks),
                        device=_device_for(mesh.device_type), hosts=hosts, host_group=host_group,
                        peer_group=peer_group)
