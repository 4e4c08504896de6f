"""pytest fixtures for multi-process tests.

Enable once for the whole suite, in the root ``tests/conftest.py``::

    pytest_plugins = ["shardwise.testing.pytest_plugin"]

Then any test can ask for ``dist_pools``::

    def test_all_reduce(dist_pools):
        results = dist_pools.get(2).run(all_reduce_ranks)   # all_reduce_ranks: module level
        assert_ranks_agree(results)

Registering the plugin in the root conftest (not per package) matters: a session fixture defined
in two conftest files is two fixtures, and each would start its own processes.
"""

from __future__ import annotations

import pytest

from .pool_cache import PoolCache

__all__ = ["dist_pools"]


@pytest.fixture(scope="session")
def dist_pools():
    """A :class:`~shardwise.testing.PoolCache` shared by the session; pools close at its end."""
    cache = PoolCache()
    yield cache
    cache.close()
