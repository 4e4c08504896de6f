"""Tensor parallelism for ``nn.Module``s on a 1-D DeviceMesh, with torch's names and semantics.

>>> import copy, torch
>>> from shardwise.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
>>> from shardwise.tensor import init_device_mesh
>>> model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
>>> ref = copy.deepcopy(model)
>>> mesh = init_device_mesh("cpu", (1,))                 # (3,) under torchrun with 3 ranks
>>> tp = parallelize_module(model, mesh, {"0": RowwiseParallel(), "1": ColwiseParallel(),
...                                       "2": RowwiseParallel()})
>>> ids = torch.tensor([[1, 9]])
>>> torch.allclose(tp(ids), ref(ids))                    # what the plain module computes
True

``embedding_index_check(False)`` skips the id range check of sharded lookups (see
``shardwise.tensor.ops.nn.embedding``).
"""

from shardwise.tensor.ops.nn.embedding import EmbeddingIndexError, embedding_index_check

from .api import parallelize_module
from .input_reshard import input_reshard
from .loss import loss_parallel
from .prepare import PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput
from .style import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

__all__ = [
    "parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
    "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput",
    "EmbeddingIndexError", "embedding_index_check", "loss_parallel", "input_reshard",
]
