"""ShardedTable: a tensor made of arbitrary row/column blocks on arbitrary ranks.

Used in state dicts where the layout is not a DTensor placement (a table on one rank, row blocks
on one host, ...). It is checkpointable by ``torch.distributed.checkpoint`` through the
``__create_write_items__`` / ``__create_chunk_list__`` / ``__get_tensor_shard__`` protocol.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

__all__ = ["ShardedTable"]

_PASSTHROUGH = {torch.ops.aten.detach.default, torch.ops.aten.alias.default}


class ShardedTable(torch.Tensor):
    """Global ``size``; this rank holds ``shards`` = [(global offsets, local tensor)].

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, table_row_wise
        >>> from shardwise.tensor import init_device_mesh
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(100, 8, "t0", feature_names=["f"])])
        >>> sharded = shard(ebc, {"t0": table_row_wise(0)}, mesh=init_device_mesh("cpu", (1, 1)))  # hosts x ranks
        >>> st = sharded.state_dict()["embedding_bags.t0.weight"]   # a 2-D mesh: no DTensor layout
        >>> st
        ShardedTable(size=(100, 8), local=[(0, 0):(100, 8)])
        >>> st.to_local().shape, st.full_tensor().shape
        (torch.Size([100, 8]), torch.Size([100, 8]))
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, shards: Sequence[tuple], size: Sequence[int], group, dtype, device,
                layout: tuple = (), replicated: bool = False):
        r = torch.Tensor._make_wrapper_subclass(cls, torch.Size(size), dtype=dtype, device=device,
                                                requires_grad=False)
        r._shards = [(tuple(int(o) for o in off), t) for off, t in shards]
        r._group = group
        # The global block list (same on every rank) lets loaders pick a path without talking.
        r.box_layout = tuple(layout)
        r.replicated = replicated
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in _PASSTHROUGH:
            src = args[0]
            return ShardedTable(src._shards, src.shape, src._group, src.dtype, src.device, src.box_layout,
                                src.replicated)
        raise TypeError(f"ShardedTable does not support {func}; take .to_local() (this rank's shard) or "
                        f".full_tensor() (the whole tensor) first")

    def __repr__(self) -> str:
        parts = ", ".join(f"{off}:{tuple(t.shape)}" for off, t in self._shards)
        return f"ShardedTable(size={tuple(self.shape)}, local=[{parts}])"

    def local_shards(self) -> list[tuple[tuple, torch.Tensor]]:
        """[(global offsets, tensor)] held by this rank (views of the module's storage)."""
        return list(self._shards)

    def to_local(self) -> torch.Tensor:
        """This rank's shard (an empty tensor on ranks holding none)."""
        if not self._shards:
            return torch.empty((0,) + tuple(self.shape[1:]), dtype=self.dtype, device=self.device)
        if len(self._shards) > 1:
            raise ValueError("this rank holds several shards; use local_shards()")
        return self._shards[0][1]

    def full_tensor(self) -> torch.Tensor:
        """The whole tensor on every rank (collective: every rank of the group must call it)."""
        if self.replicated:
            return self._shards[0][1].clone()
        full = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        for off, t in self._shards:
            full[tuple(slice(o, o + n) for o, n in zip(off, t.shape))] = t
        dist.all_reduce(full, group=self._group)
        return full

    # ---- torch.distributed.checkpoint protocol --------------------------------------------------
    def _nonempty(self):
        return [(off, t) for off, t in self._shards if t.numel() > 0]

    def __create_write_items__(self, fqn: str, obj) -> list[WriteItem]:
        return [WriteItem(
            index=MetadataIndex(fqn, torch.Size(off)), type=WriteItemType.SHARD,
            tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=torch.Size(off), sizes=t.shape),
                                        properties=TensorProperties.create_from_tensor(t), size=self.shape))
            for off, t in self._nonempty()]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=torch.Size(off), sizes=t.shape) for off, t in self._nonempty()]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for off, t in self._shards:
            if torch.Size(off) == index.offset:
                return t
        raise ValueError(f"ShardedTable {index.fqn!r} has no local shard at offset {index.offset}")
