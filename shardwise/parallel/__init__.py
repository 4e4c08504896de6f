"""Tensor parallelism for ``nn.Module``s on a 1-D DeviceMesh, with torch's names and semantics.

>>> from shardwise.parallel import parallelize_module, ColwiseParallel, RowwiseParallel  # doctest: +SKIP
>>> mesh = init_device_mesh("cpu", (3,))                                                  # doctest: +SKIP
>>> parallelize_module(model, mesh, {"emb": RowwiseParallel(), "fc1": ColwiseParallel(),
...                                  "fc2": RowwiseParallel()})                           # doctest: +SKIP

``embedding_index_check(False)`` skips the id range check of sharded lookups (see
``shardwise.tensor.ops.embedding``).
"""

from shardwise.tensor.ops.embedding import EmbeddingIndexError, embedding_index_check

from .api import parallelize_module
from .prepare import PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput
from .style import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

__all__ = [
    "parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
    "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput",
    "EmbeddingIndexError", "embedding_index_check",
]
