"""``torch.distributed.tensor.experimental`` names: ``implicit_replication``.

>>> with implicit_replication():          # doctest: +SKIP
...     y = dtensor + torch.ones(4)        # the plain tensor counts as Replicate
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

    >>> with implicit_replication():                        # doctest: +SKIP
    ...     y = distribute_tensor(x, mesh, [Shard(0)]) * torch.arange(4.0)
    """
    with IMPLICIT_REPLICATION.set(True):
        yield
