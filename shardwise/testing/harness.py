"""Run a function on N ranks of a real process group, from one test.

Worker processes are expensive to start (each imports torch), so one pool per
world size stays alive for the whole Python process and is reused by every
call; it is shut down at exit. A call that fails in any way (exception, dead
worker, hang) kills its pool and the next call starts a fresh one.

The pools' device comes from ``SHARDWISE_TEST_DEVICE`` (``cpu``, the default, or
``cuda``: ``make test-gpu``) and the backend from the device: gloo for CPU, NCCL
for CUDA, with rank *r* on ``cuda:r`` (its ``LOCAL_RANK``). A CUDA call needs one
GPU per rank and is skipped with the reason otherwise.
"""

from __future__ import annotations

import atexit
import numbers
import os
import pickle
import threading
import unittest

from shardwise.testing._errors import DistributedTestError, DistributedTestTimeout
from shardwise.testing._pool import Pool

__all__ = [
    "DEVICE_ENV",
    "DistributedTestError",
    "DistributedTestTimeout",
    "gpu_shortage",
    "pool_device_type",
    "run_on_ranks",
    "shutdown_pools",
    "worker_device",
    "worker_mesh",
]

# The device the test pools run on; the backend follows it (shardwise._device.backend_for).
DEVICE_ENV = "SHARDWISE_TEST_DEVICE"
_DEVICE_TYPES = ("cpu", "cuda")

_pools: dict[tuple[int, str], Pool] = {}
# One call at a time per process: pools are not safe for concurrent tasks.
_lock = threading.RLock()
# Worker-side cache of meshes, keyed by (device_type, shape).
_meshes: dict = {}


def pool_device_type(environ=None) -> str:
    """``"cpu"`` (gloo; the default) or ``"cuda"`` (NCCL), from ``SHARDWISE_TEST_DEVICE``.

    Example:
        >>> pool_device_type({"SHARDWISE_TEST_DEVICE": "cuda"})
        'cuda'
    """
    value = (os.environ if environ is None else environ).get(DEVICE_ENV, "cpu")
    if value not in _DEVICE_TYPES:
        raise ValueError(f"{DEVICE_ENV}={value!r} must be one of {_DEVICE_TYPES} (cuda: `make test-gpu`)")
    return value


def gpu_shortage(device_type: str, world_size: int, gpus: int) -> str | None:
    """Why ``world_size`` ranks cannot run on ``device_type`` with ``gpus`` GPUs; ``None`` if they can.

    Example:
        >>> gpu_shortage("cuda", 2, 1)
        'needs 2 GPUs, one per rank (NCCL refuses two ranks on one GPU); this machine has 1'
    """
    if device_type == "cuda" and gpus < world_size:
        return f"needs {world_size} GPUs, one per rank (NCCL refuses two ranks on one GPU); this machine has {gpus}"
    return None


def run_on_ranks(fn, world_size: int, *args, timeout: float = 120.0, **kwargs) -> list:
    """Call ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks.

    Each rank is a worker process whose default process group is already
    initialised (60 s collective timeout, one torch thread): gloo on CPU, or
    NCCL with rank *r* on ``cuda:r`` when ``SHARDWISE_TEST_DEVICE=cuda`` (a
    ``unittest.SkipTest`` with the reason where there is not one GPU per rank). ``fn``
    must be a module-level function (pickled by qualified name); args, kwargs
    and return values travel by pickle. ``timeout`` (seconds) bounds the call
    itself, not the one-off pool start-up, and cannot be forwarded to ``fn``.

    Returns:
        One result per rank, in rank order.

    Raises:
        DistributedTestError: some rank raised or its process died; the
            message holds each failing rank's traceback (or exit code) and
            the stacks of ranks stuck waiting for it.
        DistributedTestTimeout: not all ranks finished within ``timeout``;
            the message holds every rank's Python stack.

    Example (``fn`` lives in an importable test module)::

        def _sum_ranks(rank, world_size):
            t = torch.tensor([float(rank)])
            dist.all_reduce(t)
            return t.item()

        def test_sum():
            assert run_on_ranks(_sum_ranks, 4) == [6.0] * 4
    """
    _check_call(fn, world_size, timeout)
    device_type = pool_device_type()
    label = f"run_on_ranks({fn.__module__}.{fn.__qualname__}, world_size={world_size})"
    if device_type == "cuda":
        import torch

        reason = gpu_shortage(device_type, world_size, torch.cuda.device_count())
        if reason:
            raise unittest.SkipTest(f"{label} on CUDA: {reason}")
    try:
        payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"run_on_ranks: fn {fn!r}, its args or kwargs cannot be pickled ({exc}); "
            "pass plain data, tensors or module-level objects") from exc
    key = (world_size, device_type)
    with _lock:
        pool = _pool_for(key)
        try:
            return pool.run(payload, float(timeout), label)
        except DistributedTestError:
            if not pool.alive():
                _pools.pop(key, None)
            raise
        except BaseException:
            # Interrupted mid-task (Ctrl-C, pytest-timeout): state unknown.
            _pools.pop(key, None)
            pool.kill()
            raise


def _check_call(fn, world_size, timeout) -> None:
    if os.environ.get("SHARDWISE_TEST_WORKER") == "1":
        raise RuntimeError(
            "run_on_ranks was called inside a test worker; call it from the test "
            "itself (the parent process), not from the function run on the ranks")
    if not callable(fn):
        raise TypeError(f"run_on_ranks: fn must be callable, got {fn!r}")
    qualname = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not qualname or "<" in qualname or module in (None, "__main__"):
        raise ValueError(
            f"run_on_ranks: fn {fn!r} (module {module!r}, qualname {qualname!r}) is not "
            "importable by workers; define it at module level in an importable module "
            "(e.g. a test file under tests/), not as a lambda, nested function or in __main__")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"run_on_ranks: world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"run_on_ranks: world_size must be >= 1, got {world_size}")
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0:
        raise ValueError(
            f"run_on_ranks: timeout must be a positive number of seconds, got {timeout!r}")


def _pool_for(key: tuple[int, str]) -> Pool:
    pool = _pools.get(key)
    if pool is not None and not pool.alive():
        # A worker died between calls; its peers' process group is unusable.
        del _pools[key]
        pool.kill()
        pool = None
    if pool is None:
        pool = _pools[key] = Pool(*key)
    return pool


def shutdown_pools() -> None:
    """Stop every worker pool; the next :func:`run_on_ranks` starts afresh.

    Registered with ``atexit`` and called at pytest session end.

    Example:
        >>> shutdown_pools()  # no pools: nothing to do
    """
    with _lock:
        while _pools:
            _, pool = _pools.popitem()
            pool.close()


atexit.register(shutdown_pools)


def worker_mesh(shape, device_type: str | None = None):
    """This world's ``DeviceMesh`` of ``shape``, built once per worker.

    Only for use inside a function run by :func:`run_on_ranks`. Building a
    mesh creates process groups (a collective, and slow), so meshes are
    cached per ``(device_type, shape)``; the cache lives in the test workers
    only and dies with the pool. Every rank must ask for the same meshes in
    the same order, as with any collective.

    Args:
        shape: int or tuple of ints whose product is the world size.
        device_type: defaults to the pool's device (``SHARDWISE_TEST_DEVICE``);
            another one is a ``ValueError`` (its backend serves only that device).

    Example (inside ``fn(rank, world_size)`` with world_size 4)::

        mesh = worker_mesh((2, 2))
        assert mesh.size() == 4 and worker_mesh((2, 2)) is mesh
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if os.environ.get("SHARDWISE_TEST_WORKER") != "1" or not dist.is_initialized():
        raise RuntimeError(
            "worker_mesh() only works inside a function run by run_on_ranks; "
            "build meshes there, not in the test body")
    shape = _mesh_shape(shape, dist.get_world_size())
    pool_device = pool_device_type()
    if device_type is None:
        device_type = pool_device
    elif device_type != pool_device:
        raise ValueError(
            f"worker_mesh(device_type={device_type!r}) in a {pool_device!r} pool: its backend serves "
            f"{pool_device} tensors only; run the test with {DEVICE_ENV}={device_type} (CUDA: `make test-gpu`)")
    key = (device_type, shape)
    if key not in _meshes:
        _meshes[key] = init_device_mesh(device_type, shape)
    return _meshes[key]


def worker_device():
    """This rank's device inside a function run by :func:`run_on_ranks`: ``cpu``, or ``cuda:LOCAL_RANK``
    in a CUDA pool. GPU-capable tests put their tensors there.

    Example (inside ``fn``)::

        t = torch.ones(3, device=worker_device())
    """
    from shardwise._device import local_device

    return local_device(pool_device_type())


def _mesh_shape(shape, world_size: int) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise TypeError(f"worker_mesh: shape must be an int or tuple of ints, got {shape!r}") from None
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise ValueError(
            f"worker_mesh: shape must be positive ints, got {shape!r}; e.g. (2,) or (2, 2)")
    total = 1
    for d in dims:
        total *= d
    if total != world_size:
        raise ValueError(
            f"worker_mesh: shape {dims} has {total} ranks but the world has {world_size}; "
            "use a shape whose product is the world size")
    return dims
