"""An on/off setting of the core, read at call time and changed for the span of a ``with`` block."""

from __future__ import annotations

import contextlib

__all__ = ["Switch"]


class Switch:
    """Read ``.enabled`` where the behaviour is decided (not when a plan is cached), so cached plans
    follow the switch.

    >>> s = Switch("my_check", True)
    >>> with s.set(False):
    ...     s.enabled
    False
    """

    def __init__(self, name: str, enabled: bool):
        self.name, self.enabled = name, enabled

    @contextlib.contextmanager
    def set(self, enabled: bool):
        if not isinstance(enabled, bool):
            raise TypeError(f"{self.name}(enabled={enabled!r}): pass True or False")
        prev, self.enabled = self.enabled, enabled
        try:
            yield
        finally:
            self.enabled = prev
