"""Sparse feature containers: jagged bags of ids and keyed pooled outputs.

Example:
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor.from_lengths(["f1"], torch.tensor([3, 1]), torch.tensor([2, 0]))
"""

from .jagged import JaggedTensor, lengths_to_offsets
from .keyed_jagged import KeyedJaggedTensor
from .keyed_tensor import KeyedTensor

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "lengths_to_offsets"]
