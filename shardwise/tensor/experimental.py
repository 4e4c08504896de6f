"""``torch.distributed.tensor.experimental`` names: ``implicit_replication``.

>>> import torch; from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
>>> from shardwise.tensor.experimental import implicit_replication
>>> dtensor = distribute_tensor(torch.zeros(4), init_device_mesh("cpu", (1,)), [Replicate()])
>>> with implicit_replication():
...     y = dtensor + torch.ones(4)        # the plain tensor counts as Replicate
>>> y.placements, y.full_tensor()
((Replicate(),), tensor([1., 1., 1., 1.]))
"""

from __future__ import annotations

import contextlib

from .dispatch import IMPLICIT_REPLICATION

__all__ = ["implicit_replication"]


@contextlib.contextmanager
def implicit_replication():
    """Inside the block, plain ``torch.Tensor`` arguments of any shape mixed with DTensors are taken as
    replicated on the DTensors' mesh (outside it only 0-d tensors are), as PyTorch's
    ``torch.distributed.tensor.experimental.implicit_replication``. The plain tensor must hold the same
    values on every rank: it is used as each rank's replica, unchecked.

    The setting lives on a ``contextvars.ContextVar`` (this thread or asyncio task only; nothing
    process-wide changes), and a plan cached inside the block is refused outside it.

    >>> import torch; from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    >>> with implicit_replication():
    ...     y = distribute_tensor(torch.ones(4), init_device_mesh("cpu", (1,)), [Shard(0)]) * torch.arange(4.0)
    >>> y.full_tensor()
    tensor([0., 1., 2., 3.])
    """
    with IMPLICIT_REPLICATION.set(True):
        yield
