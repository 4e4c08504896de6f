"""The rank side of the harness: one long-lived process per rank, running calls sent by the parent.

Each worker joins one process group at start-up and keeps it for its whole life, so a test pays
for process start and rendezvous once per pool, not once per test. The control channel to the
parent is a pipe that carries only the function to call and its picklable result; all tensor
traffic between ranks goes through torch.distributed collectives, as in production.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import pickle
import random
import signal
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["RankContext", "device_for_rank"]

# Replies on the pipe are tuples tagged with one of these.
READY, OK, ERR = "ready", "ok", "err"


@dataclasses.dataclass(frozen=True)
class RankContext:
    """What a function run by the harness learns about its rank; passed as its first argument.

    ``group`` is the process group of the whole pool and ``device`` the device that group's
    backend works on (CPU for gloo, this rank's GPU for NCCL): build meshes and tensors from these
    rather than assuming a device. ``seed`` is the seed every rank was seeded with before the call
    (the same on all ranks, so random "replicated" data agrees across ranks).

    Example::

        def fn(ctx, n):
            t = torch.full((n,), float(ctx.rank), device=ctx.device)
            dist.all_reduce(t, group=ctx.group)
            return t
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    group: Any
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to join the pool; sent once, at process start."""

    rank: int
    world_size: int
    backend: str
    store_host: str
    store_port: int
    pg_timeout_s: float
    stack_path: str
    parent_pid: int
    num_threads: int


def device_for_rank(backend: str, rank: int) -> torch.device:
    """The device a rank of ``backend`` computes on: its own GPU for NCCL, the CPU for gloo."""
    if backend == "nccl":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def worker_main(cfg: WorkerConfig, conn) -> None:
    """Entry point of a rank process: join the group, then serve calls until told to stop."""
    # Ctrl-C reaches the whole process group; the parent decides what happens to the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(cfg.num_threads)
    with open(cfg.stack_path, "w") as stack_file:
        # Lets the parent ask for this rank's Python stack when it looks hung inside a collective.
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
        _start_orphan_watchdog(cfg.parent_pid)
        try:
            ctx = _join_group(cfg)
        except BaseException as exc:  # noqa: BLE001 - every start-up failure is reported
            conn.send_bytes(_error_reply(-1, exc))
            return
        conn.send_bytes(pickle.dumps((READY, -1, os.getpid())))
        try:
            _serve(ctx, conn)
        finally:
            faulthandler.unregister(signal.SIGUSR1)
            dist.destroy_process_group()


def _serve(ctx: RankContext, conn) -> None:
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not payload:  # the parent's polite shutdown
            return
        conn.send_bytes(_run_one(ctx, payload))


def _join_group(cfg: WorkerConfig) -> RankContext:
    timeout = timedelta(seconds=cfg.pg_timeout_s)
    store = dist.TCPStore(cfg.store_host, cfg.store_port, cfg.world_size, False, timeout=timeout)
    device = device_for_rank(cfg.backend, cfg.rank)
    extra = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        extra["device_id"] = device
    dist.init_process_group(
        cfg.backend, store=store, rank=cfg.rank, world_size=cfg.world_size, timeout=timeout, **extra
    )
    return RankContext(cfg.rank, cfg.world_size, cfg.backend, device, dist.group.WORLD)


def _start_orphan_watchdog(parent_pid: int) -> None:
    # A parent killed with SIGKILL cannot stop its workers; without this a rank blocked in a
    # collective would linger until the group timeout.
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, name="shardwise-orphan-watchdog", daemon=True).start()


def _run_one(base: RankContext, payload: bytes) -> bytes:
    call_id = -1
    try:
        call_id, fn, args, kwargs, seed = pickle.loads(payload)
    except BaseException as exc:  # noqa: BLE001 - e.g. the test module fails to import here
        return _error_reply(call_id, exc)
    ctx = dataclasses.replace(base, seed=seed)
    _seed_everything(seed)
    # The pool outlives a test: undo the global torch modes a test may leave behind.
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    try:
        result = fn(ctx, *args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the parent re-raises it
        return _error_reply(call_id, exc)
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
    try:
        return pickle.dumps((OK, call_id, _detached_cpu(result)))
    except Exception as exc:  # noqa: BLE001
        err = TypeError(
            f"the value {fn.__qualname__} returned cannot be pickled back to the "
            f"parent ({type(exc).__name__}: {exc}); return tensors, numbers, strings or "
            "containers of them"
        )
        return _error_reply(call_id, err)


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def _detached_cpu(value: Any) -> Any:
    """Tensors travel back detached and on the CPU; the parent may have no GPU context."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _detached_cpu(v)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_detached_cpu(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_detached_cpu(v) for v in value)
    return value


def _error_reply(call_id: int, exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt; find out here
    except Exception:  # noqa: BLE001
        blob = None
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return pickle.dumps((ERR, call_id, (blob, kind, str(exc), text)))
