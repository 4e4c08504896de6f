"""The distributed tensor core: ``DTensor`` over a ``DeviceMesh`` with frozen placements.

Names mirror ``torch.distributed.tensor`` so code ports by changing the import.

>>> import torch
>>> from shardwise.tensor import distribute_tensor, init_device_mesh, Shard
>>> mesh = init_device_mesh("cpu", (1,))             # one rank here; (2,) under torchrun with 2 ranks
>>> w = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)])
>>> w.placements, w.to_local().shape                 # this rank's rows: 4 / mesh size
((Shard(dim=0),), torch.Size([4, 2]))
"""

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from . import ops as _ops  # noqa: F401  (registers the sharding rules)
from .checks.agreement import rank_checks
from .collectives import CollectiveCounter, CollectiveTimeoutError
from .dtensor import DTensor, fast_path, gather_fallback, propagation_cache
from .distribute import distribute_module, distribute_tensor
from .ops.nn.embedding import EmbeddingIndexError, embedding_index_check
from .placements import MaskPartial, NormPartial, Partial, Placement, Replicate, Shard
from .redistribute import plan_redistribute
from .spec import DTensorSpec

# torch.load(weights_only=True) rebuilds only allow-listed classes: ours, as PyTorch lists its DTensor's
torch.serialization.add_safe_globals([DTensor, DTensorSpec, DeviceMesh, Shard, Replicate, Partial, MaskPartial,
                                      NormPartial])

__all__ = [
    "DTensor", "DTensorSpec", "DeviceMesh", "init_device_mesh", "distribute_tensor", "distribute_module", "Placement", "Shard",
    "Replicate", "Partial", "MaskPartial", "NormPartial", "plan_redistribute", "CollectiveCounter", "CollectiveTimeoutError", "propagation_cache",
    "gather_fallback", "fast_path", "EmbeddingIndexError", "embedding_index_check", "rank_checks",
]
