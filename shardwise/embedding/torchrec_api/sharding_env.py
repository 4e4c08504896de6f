"""``ShardingEnv``: the process group a model is sharded over, in TorchRec's shape
(``torchrec.distributed.types.ShardingEnv``); :class:`~shardwise.embedding.DistributedModelParallel`
turns it into the 1-D mesh that :func:`~shardwise.embedding.shard` takes.

Example:
    >>> import torch.distributed as dist
    >>> env = ShardingEnv.from_process_group(dist.group.WORLD)
    >>> env.world_size, env.rank
    (1, 0)
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

__all__ = ["ShardingEnv", "mesh_for"]


class ShardingEnv:
    """``world_size``, ``rank`` and the process group ``pg`` (TorchRec's signature;
    ``output_dtensor`` is accepted and must stay False: state dicts already hold DTensors where the
    layout is one)."""

    def __init__(self, world_size: int, rank: int, pg: Optional[Any] = None, output_dtensor: bool = False) -> None:
        if output_dtensor:
            raise ValueError("ShardingEnv(output_dtensor=True) is not supported: sharded state-dict entries are "
                             "DTensors wherever the layout is a DTensor placement (ShardedTable otherwise)")
        self.world_size, self.rank, self.process_group, self.output_dtensor = int(world_size), int(rank), pg, False

    @classmethod
    def from_process_group(cls, pg: Any) -> "ShardingEnv":
        """The env of ``pg`` (this rank's rank in it)."""
        return cls(dist.get_world_size(pg), dist.get_rank(pg), pg)

    @classmethod
    def from_local(cls, world_size: int, rank: int) -> "ShardingEnv":
        """TorchRec's env without a process group; DistributedModelParallel then uses the default group,
        which must have ``world_size`` ranks."""
        return cls(world_size, rank, None)

    def mesh(self, device_type: str, who: str):
        """The 1-D DeviceMesh over this env's ranks (collective-free for the default group)."""
        from torch.distributed.device_mesh import DeviceMesh

        if not dist.is_initialized():
            raise RuntimeError(f"{who}: needs an initialised torch.distributed process group; call "
                               f"dist.init_process_group first")
        pg = self.process_group if self.process_group is not None else dist.group.WORLD
        if dist.get_world_size(pg) != self.world_size or dist.get_rank(pg) != self.rank:
            raise ValueError(f"{who}: env says world_size={self.world_size}, rank={self.rank} but its process group "
                             f"has {dist.get_world_size(pg)} ranks and this is rank {dist.get_rank(pg)}; build it "
                             f"with ShardingEnv.from_process_group(pg)")
        return DeviceMesh.from_group(pg, device_type)

    def __repr__(self) -> str:
        return f"ShardingEnv(world_size={self.world_size}, rank={self.rank})"


def mesh_for(env, device, mesh, who: str):
    """The mesh for TorchRec's ``env``/``device`` (or our ``mesh``); None: the default group's."""
    if mesh is not None and env is not None:
        raise ValueError(f"{who}: pass env= (TorchRec's) or mesh= (ours), not both")
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{who}: device={device} but this process sees no CUDA device; pass "
                             f"device=torch.device('cpu') (or leave it out: the default group's device type)")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"{who}: device={device}: sharded collections run on 'cpu' or 'cuda' devices")
        if mesh is not None and mesh.device_type != device.type:
            raise ValueError(f"{who}: device={device} but the mesh is on {mesh.device_type!r}; pass one of them")
    if mesh is not None:
        return mesh
    if env is not None or device is not None:
        env = env if env is not None else ShardingEnv.from_process_group(dist.group.WORLD) \
            if dist.is_initialized() else None
        if env is None:
            raise RuntimeError(f"{who}: needs an initialised torch.distributed process group; call "
                               f"dist.init_process_group first")
        if not isinstance(env, ShardingEnv):
            raise TypeError(f"{who}: env must be a ShardingEnv (e.g. ShardingEnv.from_process_group(pg)), got "
                            f"{type(env).__name__}; pass a plan by keyword: plan=...")
        from ..._device import default_group_device_type
        return env.mesh(device.type if device is not None else default_group_device_type(), who)
    return None
