"""Pools shared by a whole test session, one per (world size, backend)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .pool import ProcessPool, default_backend

__all__ = ["PoolCache"]


class PoolCache:
    """Hands out started :class:`ProcessPool` objects and keeps them for reuse.

    At most ``max_pools`` pools stay alive (least recently used one closed first): each rank is a
    process holding torch in memory. ``pool_options`` go to every :class:`ProcessPool`.

    Example::

        cache = PoolCache()
        try:
            results = cache.get(2).run(fn)
        finally:
            cache.close()
    """

    def __init__(self, max_pools: int = 3, **pool_options: Any) -> None:
        if not isinstance(max_pools, int) or max_pools < 1:
            raise ValueError(f"max_pools={max_pools!r}: must be an int >= 1")
        self._max_pools = max_pools
        self._options = pool_options
        self._pools: OrderedDict[tuple[int, str], ProcessPool] = OrderedDict()

    def get(self, world_size: int, backend: str | None = None) -> ProcessPool:
        """The pool for ``world_size`` ranks on ``backend`` (default: :func:`default_backend`)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r}: must be an int >= 1; use e.g. get(2)")
        key = (world_size, default_backend(world_size) if backend is None else backend)
        pool = self._pools.pop(key, None)
        if pool is None:
            pool = ProcessPool(key[0], key[1], **self._options)
        self._pools[key] = pool  # most recently used last
        while len(self._pools) > self._max_pools:
            _, oldest = self._pools.popitem(last=False)
            oldest.close()
        return pool.start()

    def close(self) -> None:
        """Close every pool; the cache can still be used afterwards (pools restart on demand)."""
        while self._pools:
            _, pool = self._pools.popitem(last=False)
            pool.close()

    def __repr__(self) -> str:
        return f"PoolCache({list(self._pools.values())!r})"
