"""Tensor parallelism for ``nn.Module``s on a 1-D DeviceMesh, uneven sizes included.

>>> from shardwise.parallel import parallelize_module, ColwiseParallel, RowwiseParallel  # doctest: +SKIP
>>> mesh = init_device_mesh("cpu", (3,))                                                  # doctest: +SKIP
>>> parallelize_module(model, mesh, {"emb": RowwiseParallel(), "fc1": ColwiseParallel(),
...                                  "fc2": RowwiseParallel()})                           # doctest: +SKIP

``embedding_index_check(False)`` skips the id range check of sharded lookups (see
``shardwise.tensor.ops.embedding``).
"""

from shardwise.tensor.ops.embedding import EmbeddingIndexError, embedding_index_check

from .api import parallelize_module
from .style import ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel

__all__ = [
    "parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "PrepareModuleInput",
    "EmbeddingIndexError", "embedding_index_check",
]
