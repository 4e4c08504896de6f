"""Test support for shardwise: run code on real ranks from pytest (gloo on CPU; NCCL on CUDA with
``SHARDWISE_TEST_DEVICE=cuda``), simulate ranks in one process, and compare results.

* :func:`run_on_ranks` calls a module-level ``fn(rank, world_size, *args, **kwargs)`` on N ranks from a
  session-wide, reused worker pool; failures and hangs raise :class:`DistributedTestError` /
  :class:`DistributedTestTimeout` with every rank's traceback or stack. Inside ``fn``,
  :func:`worker_mesh` gives a cached ``DeviceMesh`` and :func:`worker_device` this rank's device.
  Each rank runs with its own ``PYTHONHASHSEED``, so code that orders collectives by ``hash()``
  fails loudly in tests.
* :mod:`simulate`: per-rank lists and the collectives on them, for single-process rule tests.
* comparison helpers that name what differs.

Example (``_fn`` must be module-level in an importable module)::

    from shardwise.testing import run_on_ranks

    def _fn(rank, world_size):
        return rank * 10

    def test_ranks():
        assert run_on_ranks(_fn, 2) == [0, 10]

and the comparisons (in a test, on a rank, anywhere):

    >>> import torch; from shardwise.testing import assert_close
    >>> assert_close(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]), what="forward output")
    Traceback (most recent call last):
    AssertionError: forward output: Tensor-likes are not close! ...
"""

from . import simulate
from .compare import assert_close, assert_ranks_agree, assert_same, assert_same_on_all_ranks, assert_shards_match
from .harness import (
    DistributedTestError,
    DistributedTestTimeout,
    gpu_shortage,
    pool_device_type,
    run_on_ranks,
    shutdown_pools,
    worker_device,
    worker_mesh,
)

__all__ = [
    "DistributedTestError", "DistributedTestTimeout", "run_on_ranks", "shutdown_pools", "worker_mesh",
    "worker_device", "pool_device_type", "gpu_shortage",
    "simulate", "assert_same", "assert_close", "assert_ranks_agree", "assert_same_on_all_ranks",
    "assert_shards_match",
]
