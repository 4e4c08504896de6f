"""Torch functions that a ``with`` block takes over when they get a DTensor (``loss_parallel()``'s
cross-entropy), checked at the top of ``DTensor.__torch_function__``.

A hook is registered once, with the ``Switch`` that turns it on; it runs only while that switch is on
in the calling context (a context variable: another thread keeps running the ordinary path). While no
such block is open anywhere, the check costs one attribute read per call.

>>> from shardwise.tensor._switch import Switch
>>> s = Switch("demo_hook", False)
>>> HOOKS.register([len], s, lambda func, args, kwargs: NotImplemented)
>>> HOOKS.lookup(len) is None, HOOKS.open
(True, 0)
>>> with HOOKS.enabled(s):
...     HOOKS.lookup(len) is not None, HOOKS.open
(True, 1)
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Optional

__all__ = ["HOOKS", "FunctionHooks"]


class FunctionHooks:
    """func -> (switch, handler). ``handler(func, args, kwargs)`` returns the result, or
    ``NotImplemented`` to let the call take the ordinary path."""

    def __init__(self):
        self.table: dict = {}
        self.open = 0  # blocks open in any thread: 0 (the usual case) skips the lookup
        self._lock = threading.Lock()

    def register(self, funcs, switch, handler: Callable) -> None:
        for f in funcs:
            self.table[f] = (switch, handler)

    def lookup(self, func) -> Optional[Callable]:
        hook = self.table.get(func)
        return hook[1] if hook is not None and hook[0].get() else None

    @contextlib.contextmanager
    def enabled(self, switch):
        """Turn ``switch`` on for the block (this context only) and count the block as open."""
        with switch.set(True):
            with self._lock:
                self.open += 1
            try:
                yield
            finally:
                with self._lock:
                    self.open -= 1


HOOKS = FunctionHooks()
