"""Sparse feature containers: jagged bags of ids and keyed pooled outputs (TorchRec's API).

Example:
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor(["f1"], torch.tensor([3, 1]), None, torch.tensor([2, 0]))
"""

from .fx import SparseTracer, symbolic_trace
from .jagged import JaggedTensor, lengths_to_offsets
from .keyed_jagged import KeyedJaggedTensor
from .keyed_tensor import KeyedTensor
from .helpers import ComputeJTDictToKJT, ComputeKJTToJTDict, jt_is_equal, kjt_is_equal  # noqa: E402 (after the types)

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "lengths_to_offsets", "SparseTracer",
           "symbolic_trace", "jt_is_equal", "kjt_is_equal", "ComputeKJTToJTDict", "ComputeJTDictToKJT"]
