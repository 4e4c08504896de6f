"""Debugging aids with ``torch.distributed.tensor.debug``'s names.

>>> from shardwise.tensor.debug import CommDebugMode   # doctest: +SKIP
"""

from .comm_mode import CommDebugMode

__all__ = ["CommDebugMode"]
