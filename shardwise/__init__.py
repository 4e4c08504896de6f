"""shardwise: shard PyTorch training across processes and machines.

The packages, each with its own facade: ``shardwise.tensor`` (DTensor), ``shardwise.parallel``
(tensor-parallel styles), ``shardwise.sparse`` (KeyedJaggedTensor), ``shardwise.embedding`` (sharded
embedding collections, planner, live reshard), ``shardwise.optim`` (TorchRec's keyed optimizers), ``shardwise.compile`` (compile-mode data parallel),
``shardwise.data`` and ``shardwise.train`` (the ``shardwise train`` job), ``shardwise.serve`` (the trained
model out: ``shardwise export`` / ``shardwise predict``); TorchRec's model and data
zoo: ``shardwise.models`` (``models.dlrm``: DLRM, DLRM_DCN, DLRMTrain...), ``shardwise.modules``
(MLP, LowRankCrossNet) and ``shardwise.datasets`` (RandomRecDataset, Batch).

Example (in a process group; world size 1 here):
    >>> import torch
    >>> from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
    >>> mesh = init_device_mesh("cpu", (1,))
    >>> distribute_tensor(torch.arange(6.0).reshape(3, 2), mesh, [Shard(0)]).full_tensor().sum().item()
    15.0
"""

# registers the at-exit release of destroyed process groups (see _exit.py: without it, a rank that
# used shardwise could abort at exit after destroy_process_group)
from . import _exit as _exit  # noqa: F401

__version__ = "0.1.0"
__all__ = ["__version__"]
