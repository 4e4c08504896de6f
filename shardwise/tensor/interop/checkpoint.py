"""``torch.distributed.checkpoint`` support for DTensor: each rank writes and reads its own chunk.

DCP asks a tensor-like object for its write items, its chunk list and the local tensor of a chunk.
A DTensor's chunk is its local shard at its global offset; replicated copies describe the same chunk on
every rank (DCP keeps one). Loading into another layout or world size works because DCP matches the
saved chunks to the chunks the target DTensor asks for. Pending (Partial) values cannot be saved.

>>> import tempfile, torch.distributed.checkpoint as dcp
>>> from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
>>> mesh = init_device_mesh("cpu", (1,))
>>> w = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)])
>>> other = distribute_tensor(torch.zeros(4, 2), mesh, [Replicate()])    # another layout
>>> with tempfile.TemporaryDirectory() as ckpt:
...     meta = dcp.save({"w": w}, checkpoint_id=ckpt)
...     dcp.load({"w": other}, checkpoint_id=ckpt)                        # fills it in place
>>> torch.equal(other.full_tensor(), w.full_tensor())
True
"""

from __future__ import annotations

import torch

from ..placements import Partial
from ..spec import mesh_coord


def _check(x) -> None:
    if any(isinstance(p, Partial) for p in x._spec.placements):
        raise ValueError(
            f"cannot checkpoint a DTensor with pending reductions {[str(p) for p in x._spec.placements]}; "
            "redistribute it to Replicate()/Shard() first"
        )


def chunk(x):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    _check(x)
    coord = mesh_coord(x._spec.mesh)
    sizes = torch.Size(x._spec.local_shape(coord))
    offsets = torch.Size(x._spec.local_offset(coord))
    return ChunkStorageMetadata(offsets=offsets, sizes=sizes)


def write_items(fqn: str, x) -> list:
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    c = chunk(x)
    data = TensorWriteData(chunk=c, properties=TensorProperties.create_from_tensor(x._local_tensor), size=x.shape)
    return [WriteItem(index=MetadataIndex(fqn, c.offsets), type=WriteItemType.SHARD, tensor_data=data)]
