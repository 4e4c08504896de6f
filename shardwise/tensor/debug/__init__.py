"""Debugging aids with ``torch.distributed.tensor.debug``'s names.

>>> import torch, torch.distributed as dist
>>> from shardwise.tensor.debug import CommDebugMode
>>> with CommDebugMode() as comm:
...     dist.all_reduce(torch.ones(1))
>>> comm.get_total_counts()
1
"""

from .comm_mode import CommDebugMode

__all__ = ["CommDebugMode"]
