"""Session-wide pytest hooks.

Kept free of shardwise imports at module level (other packages are being
written concurrently); the harness is imported lazily at session end.
"""

from __future__ import annotations

import sys


def pytest_sessionfinish(session, exitstatus):
    # Stop the distributed-test worker pools now rather than at interpreter
    # exit, so their shutdown is not mixed with pytest's own teardown.
    harness = sys.modules.get("shardwise.testing.harness")
    if harness is not None:
        harness.shutdown_pools()
