"""Sparse feature containers: jagged bags of ids and keyed pooled outputs (TorchRec's API).

Example:
    >>> import torch
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor(["f1"], torch.tensor([3, 1]), None, torch.tensor([2, 0]))
    >>> kjt["f1"].to_dense()     # sample 0's bag holds ids 3 and 1, sample 1's is empty
    [tensor([3, 1]), tensor([], dtype=torch.int64)]
"""

from .fx import SparseTracer, symbolic_trace
from .jagged import JaggedTensor, lengths_to_offsets
from .keyed_jagged import KeyedJaggedTensor
from .keyed_tensor import KeyedTensor
from .helpers import ComputeJTDictToKJT, ComputeKJTToJTDict, jt_is_equal, kjt_is_equal  # noqa: E402 (after the types)

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "lengths_to_offsets", "SparseTracer",
           "symbolic_trace", "jt_is_equal", "kjt_is_equal", "ComputeKJTToJTDict", "ComputeJTDictToKJT"]
