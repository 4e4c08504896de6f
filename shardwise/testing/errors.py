"""Exceptions the multi-process harness raises in the parent process.

A test that runs code on several ranks fails in one of four ways, and each gets its own type so a
report says at once which one happened:

- every rank raised the same exception (same type and message): it is re-raised in the parent, as
  its own type so ``pytest.raises(ValueError)`` works, with the remote traceback as ``__cause__``;
- ranks disagree (some returned, some raised, or they raised different errors):
  :class:`RankDivergenceError` — the house rule is that errors are decided identically on every rank;
- some rank did not answer in time (usually a collective one rank never entered):
  :class:`RankTimeoutError`, with a stack dump of every late rank;
- a rank process died (segfault, ``os._exit``): :class:`WorkerDiedError`.
"""

from __future__ import annotations

__all__ = [
    "RemoteTraceback",
    "RemoteRankError",
    "RankDivergenceError",
    "RankTimeoutError",
    "WorkerDiedError",
]


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised on a rank; used as ``__cause__``."""

    def __init__(self, rank: int, text: str) -> None:
        super().__init__(rank, text)
        self.rank = rank
        self.text = text

    def __str__(self) -> str:
        text = self.text.rstrip()
        return f"\n--- traceback on rank {self.rank} ---\n{text}\n--- end of rank {self.rank} ---"


class RemoteRankError(RuntimeError):
    """Stands in for an exception from a rank that could not be pickled back to the parent."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message


class RankDivergenceError(AssertionError):
    """Ranks ended the same call differently (a return on one, an exception on another, ...)."""


class RankTimeoutError(AssertionError):
    """Some rank had not finished by the deadline; the message holds each late rank's stack."""


class WorkerDiedError(AssertionError):
    """A rank's process exited while running a call (crash, ``os._exit``, killed)."""
