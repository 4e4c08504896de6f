"""Prepare the next batches on one helper thread while the current step trains.

The job's host-side batch preparation (the synthetic log's generation, the KeyedJaggedTensor) is
pure local work that depends only on the stream position, so it can run ahead without changing
what is trained: the batches come out in the same order with the same contents. numpy and torch
release the interpreter lock in their kernels, so the helper fills the time the training thread
spends waiting on collectives. Only for readers that run no collective (a reader that agrees on
errors across ranks must be called from the training thread, in step).

Example:
    >>> it = Prefetched(iter(range(5)), depth=2)
    >>> list(it)
    [0, 1, 2, 3, 4]
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator

__all__ = ["Prefetched"]

_END = object()


class Prefetched:
    """Iterates ``source`` on a helper thread, at most ``depth`` items ahead; an exception in the
    source is raised by ``next()`` where the item would have come. :meth:`close` stops the helper."""

    def __init__(self, source: Iterator, depth: int = 2):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"Prefetched: depth={depth!r} must be an int >= 1 (batches prepared ahead)")
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(source,), name="shardwise-prefetch", daemon=True)
        self._thread.start()
        self._done = False

    def _fill(self, source: Iterator) -> None:
        try:
            for item in source:
                if not self._put((True, item)):
                    return
        except BaseException as e:   # handed to the consumer, raised there
            self._put((False, e))
            return
        self._put((True, _END))

    def _put(self, entry) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        ok, item = self._q.get()
        if not ok:
            self._done = True
            raise item
        if item is _END:
            self._done = True
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the helper (it finishes the item it is preparing) and wait for it."""
        self._stop.set()
        self._done = True
        self._thread.join()
