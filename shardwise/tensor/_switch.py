"""An on/off setting of the core, read at call time and changed for the span of a ``with`` block.

The value lives on a ``contextvars.ContextVar``: a ``with`` block changes it for the code it runs
(in this thread, or this asyncio task) only. Another thread starts from the default and never
sees it, so two threads (a training loop and an evaluation thread, say) cannot switch each other's
checks off, and no library call ever flips a process-wide value it has to reset afterwards.
"""

from __future__ import annotations

import contextlib
import contextvars

__all__ = ["Switch"]


class Switch:
    """Read ``.enabled`` (or call ``.get()``, the cheaper form for hot paths) where the behaviour is
    decided, not when a plan is cached, so cached plans follow the switch.

    >>> s = Switch("my_check", True)
    >>> with s.set(False):
    ...     s.enabled
    False
    >>> s.enabled
    True
    """

    def __init__(self, name: str, default: bool):
        self.name = name
        self._var = contextvars.ContextVar(f"shardwise.{name}", default=bool(default))
        self.get = self._var.get  # bound C method: one call, no attribute walk

    @property
    def enabled(self) -> bool:
        return self._var.get()

    @contextlib.contextmanager
    def set(self, enabled: bool):
        """Use ``enabled`` inside the ``with`` block; the previous value comes back after it."""
        if not isinstance(enabled, bool):
            raise TypeError(f"{self.name}(enabled={enabled!r}): pass True or False")
        token = self._var.set(enabled)
        try:
            yield
        finally:
            self._var.reset(token)

    def __repr__(self) -> str:
        return f"Switch({self.name!r}, enabled={self.enabled})"
