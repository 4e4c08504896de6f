"""Test support for shardwise: run code on real ranks from a pytest test.

Two entry points live here (to be merged; see the lead's decision):

* :func:`run_on_ranks` (``harness.py``): the contract every distributed test
  uses. Call ``fn(rank, world_size, *args, **kwargs)`` on N gloo ranks from a
  session-wide, reused worker pool; failures and hangs raise
  :class:`DistributedTestError` / :class:`DistributedTestTimeout` with every
  rank's traceback or stack. Inside ``fn``, :func:`worker_mesh` gives a cached
  ``DeviceMesh``. How-to: ``shardwise/testing/README.md``.
* :class:`ProcessPool` / :class:`PoolCache` / :mod:`simulate` / comparison
  helpers (``pool.py``, ``compare.py``, ``simulate.py``).

Example (``_fn`` must be module-level in an importable module)::

    from shardwise.testing import run_on_ranks

    def _fn(rank, world_size):
        return rank * 10

    def test_ranks():
        assert run_on_ranks(_fn, 2) == [0, 10]
"""

from . import simulate
from .compare import (
    assert_close,
    assert_ranks_agree,
    assert_same,
    assert_same_on_all_ranks,
    assert_shards_match,
)
from .errors import (
    RankDivergenceError,
    RankTimeoutError,
    RemoteRankError,
    RemoteTraceback,
    WorkerDiedError,
)
from .harness import (
    DistributedTestError,
    DistributedTestTimeout,
    run_on_ranks,
    shutdown_pools,
    worker_mesh,
)
from .pool import ProcessPool, default_backend, run_distributed
from .pool_cache import PoolCache
from .worker import RankContext, device_for_rank

__all__ = [
    # harness.py: the run_on_ranks contract
    "DistributedTestError",
    "DistributedTestTimeout",
    "run_on_ranks",
    "shutdown_pools",
    "worker_mesh",
    # pool.py & co.
    "ProcessPool",
    "PoolCache",
    "RankContext",
    "run_distributed",
    "default_backend",
    "device_for_rank",
    "simulate",
    "assert_same",
    "assert_close",
    "assert_ranks_agree",
    "assert_same_on_all_ranks",
    "assert_shards_match",
    "RankDivergenceError",
    "RankTimeoutError",
    "WorkerDiedError",
    "RemoteRankError",
    "RemoteTraceback",
]
