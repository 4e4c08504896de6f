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

import torch.distributed as dist

__all__ = ["ShardingEnv"]


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
