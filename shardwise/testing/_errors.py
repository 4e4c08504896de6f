"""Exceptions raised in the parent process by :func:`run_on_ranks`."""

from __future__ import annotations


class DistributedTestError(Exception):
    """One or more ranks of a distributed test failed.

    The message holds every failing rank's full traceback and the stacks of
    ranks that had to be killed.

    Attributes:
        failures: rank -> report text (traceback, or exit code for a
            worker that died) for every rank that failed.
        stacks: rank -> Python stack dumped from a rank that did not finish
            (stuck in a collective, or still running at the timeout).

    Example:
        >>> err = DistributedTestError("rank 1 failed", failures={1: "boom"})
        >>> err.failures
        {1: 'boom'}
    """

    def __init__(
        self,
        message: str,
        failures: dict[int, str] | None = None,
        stacks: dict[int, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})
        self.stacks = dict(stacks or {})


class DistributedTestTimeout(DistributedTestError):
    """Not every rank finished within the timeout; ``stacks`` has each rank's
    Python stack at the moment the harness gave up.

    Example:
        >>> issubclass(DistributedTestTimeout, DistributedTestError)
        True
    """
