"""The parent side of the harness: a reusable pool of rank processes sharing one process group.

Starting processes and joining a gloo group costs seconds on a 2-core machine, so a
:class:`ProcessPool` is started once and then runs many calls. A call that fails in a way that can
leave the group inconsistent (ranks disagree, a rank hangs or dies, the parent is interrupted)
kills the processes, and the next call starts fresh ones: a failing test never poisons the next.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import tempfile
import time
from multiprocessing.connection import wait
from typing import Any, Callable

import torch
import torch.distributed as dist

from .errors import (
    RankDivergenceError,
    RankTimeoutError,
    RemoteRankError,
    RemoteTraceback,
    WorkerDiedError,
)
from .worker import ERR, OK, READY, WorkerConfig, worker_main

__all__ = ["ProcessPool", "run_distributed", "default_backend"]

_BACKENDS = ("gloo", "nccl")
_STACK_LINES = 40


def default_backend(world_size: int) -> str:
    """NCCL when this machine has a GPU per rank, gloo otherwise."""
    if dist.is_nccl_available() and torch.cuda.is_available():
        if torch.cuda.device_count() >= world_size:
            return "nccl"
    return "gloo"


class ProcessPool:
    """``world_size`` rank processes in one process group, running functions on every rank.

    ``fn`` must be a module-level function (it is pickled by name) taking a
    :class:`~shardwise.testing.RankContext` first. :meth:`run` returns the per-rank results in
    rank order, or raises: the ranks' own exception when all raised the same one, otherwise
    :class:`RankDivergenceError`, :class:`RankTimeoutError` or :class:`WorkerDiedError`.

    By default each rank gets a different ``PYTHONHASHSEED``, so code whose collectives depend on
    ``hash()`` of strings diverges here instead of in production.

    Example::

        def add_ranks(ctx):
            t = torch.tensor([ctx.rank + 1.0], device=ctx.device)
            dist.all_reduce(t, group=ctx.group)
            return t

        with ProcessPool(2) as pool:
            assert [t.item() for t in pool.run(add_ranks)] == [3.0, 3.0]
    """

    def __init__(
        self,
        world_size: int,
        backend: str | None = None,
        *,
        pg_timeout_s: float = 300.0,
        start_timeout_s: float = 180.0,
        num_threads: int = 1,
        distinct_hash_seeds: bool = True,
    ) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(
                f"world_size={world_size!r}: must be an int >= 1; use e.g. ProcessPool(2)"
            )
        backend = default_backend(world_size) if backend is None else backend
        if backend not in _BACKENDS:
            raise ValueError(f"backend={backend!r}: must be one of {_BACKENDS}; use 'gloo' on CPU")
        if backend == "nccl" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"backend='nccl' with world_size={world_size}: NCCL needs one GPU per rank and "
                f"this machine has {torch.cuda.device_count()}; use backend='gloo'"
            )
        self.world_size = world_size
        self.backend = backend
        self._pg_timeout_s = pg_timeout_s
        self._start_timeout_s = start_timeout_s
        self._num_threads = num_threads
        self._distinct_hash_seeds = distinct_hash_seeds
        self._procs: list = []
        self._conns: list = []
        self._store = None
        self._tmpdir: str | None = None
        self._call_id = 0
        self.starts = 0  # how many times processes were (re)started; tests check reuse with it

    # -- life cycle --------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """True while every rank process is running and ready for a call."""
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> "ProcessPool":
        """Start the rank processes and wait until all joined the group (no-op when alive)."""
        if self.alive:
            return self
        self._kill()
        self._tmpdir = tempfile.mkdtemp(prefix="shardwise-pool-")
        # The parent hosts the rendezvous store on a free port it already holds: no port races.
        self._store = dist.TCPStore("127.0.0.1", 0, self.world_size, True, wait_for_workers=False)
        ctx = mp.get_context("spawn")  # fork is unsafe after torch/CUDA initialised threads
        try:
            for rank in range(self.world_size):
                self._spawn_rank(ctx, rank)
            self._await_ready()
        except BaseException:
            self._kill()
            raise
        self.starts += 1
        return self

    def _spawn_rank(self, ctx, rank: int) -> None:
        cfg = WorkerConfig(
            rank=rank,
            world_size=self.world_size,
            backend=self.backend,
            store_host="127.0.0.1",
            store_port=self._store.port,
            pg_timeout_s=self._pg_timeout_s,
            stack_path=os.path.join(self._tmpdir, f"stack-rank{rank}.txt"),
            parent_pid=os.getpid(),
            num_threads=self._num_threads,
        )
        env = {"OMP_NUM_THREADS": str(self._num_threads)}
        if self._distinct_hash_seeds:
            env["PYTHONHASHSEED"] = str(1 + rank)
        parent_end, child_end = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=worker_main, args=(cfg, child_end), name=f"shardwise-rank{rank}", daemon=True
        )
        with _environment(env):  # a spawned child inherits the environment at start()
            proc.start()
        child_end.close()
        self._procs.append(proc)
        self._conns.append(parent_end)

    def _await_ready(self) -> None:
        replies, late = self._collect(self._start_timeout_s, grace_s=self._start_timeout_s)
        if late:
            raise RuntimeError(
                f"ranks {late} of a {self.world_size}-rank {self.backend} pool did not start "
                f"within {self._start_timeout_s:.0f} s; the machine may be overloaded: retry, or "
                "raise start_timeout_s"
            )
        bad = {r: reply for r, reply in replies.items() if reply[0] != READY}
        if bad:
            lines = [f"rank {r}: {_describe(reply)}" for r, reply in sorted(bad.items())]
            raise RuntimeError(
                f"a {self.world_size}-rank {self.backend} pool failed to start:\n"
                + "\n".join(lines)
            )

    def close(self) -> None:
        """Ask every rank to leave the group and exit; kill those that do not within 5 s."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"")
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(5.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._store = [], [], None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "ProcessPool":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "stopped"
        return f"ProcessPool(world_size={self.world_size}, backend={self.backend!r}, {state})"

    # -- running calls -----------------------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout_s: float = 60.0,
        seed: int = 0,
        error_grace_s: float = 5.0,
        **kwargs: Any,
    ) -> list:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the results in rank order.

        Every rank is seeded with ``seed`` first. When one rank raises, the others get
        ``error_grace_s`` to finish (they are usually stuck in a collective the failing rank never
        entered) before they are reported as hung. ``timeout_s`` bounds the whole call.
        """
        payload = self._payload(fn, args, kwargs, seed)
        self.start()
        try:
            for conn in self._conns:
                conn.send_bytes(payload)
            replies, late = self._collect(timeout_s, error_grace_s)
        except BaseException:
            # Interrupted mid-call (Ctrl-C, pytest-timeout): replies may still be in flight.
            self._kill()
            raise
        return self._conclude(fn, replies, late)

    def _payload(self, fn, args, kwargs, seed: int) -> bytes:
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is not callable; pass a module-level function")
        self._call_id += 1
        try:
            return pickle.dumps((self._call_id, fn, args, kwargs, seed))
        except Exception as exc:
            raise TypeError(
                f"cannot send {getattr(fn, '__qualname__', fn)!r} and its arguments to the ranks "
                f"({type(exc).__name__}: {exc}); ranks import functions by name, so define fn at "
                "module level (no lambdas or nested functions) and pass picklable arguments"
            ) from exc

    def _collect(self, timeout_s: float, grace_s: float) -> tuple[dict, list]:
        """Wait for one reply per rank; returns replies by rank and the ranks still running."""
        pending = dict(enumerate(self._conns))
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for conn in wait(list(pending.values()), timeout=remaining):
                rank = self._conns.index(conn)
                del pending[rank]
                replies[rank] = self._receive(rank, conn)
                if replies[rank][0] not in (OK, READY):
                    deadline = min(deadline, time.monotonic() + grace_s)
        return replies, sorted(pending)

    def _receive(self, rank: int, conn) -> tuple:
        try:
            reply = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            self._procs[rank].join(1.0)
            return ("died", self._call_id, self._procs[rank].exitcode)
        except Exception as exc:  # noqa: BLE001 - e.g. a result class the parent cannot import
            text = f"the parent could not unpickle rank {rank}'s reply: {type(exc).__name__}: {exc}"
            return (ERR, self._call_id, (None, "pickle.UnpicklingError", text, text))
        if reply[0] != READY and reply[1] != -1:  # -1: the reply came before a call id was read
            assert reply[1] == self._call_id, (
                f"rank {rank} answered call {reply[1]} during call {self._call_id}: "
                "the pool's pipe is out of step"
            )
        return reply

    def _conclude(self, fn, replies: dict, late: list) -> list:
        name = getattr(fn, "__qualname__", repr(fn))
        if late:
            stacks = self._dump_stacks(late)
            self._kill()
            lines = [_describe(replies[r]) if r in replies else stacks[r]
                     for r in range(self.world_size)]
            raise RankTimeoutError(_report(f"{name}: ranks {late} did not finish", lines))
        kinds = [replies[r][0] for r in range(self.world_size)]
        if "died" in kinds:
            self._kill()
            lines = [_describe(replies[r]) for r in range(self.world_size)]
            raise WorkerDiedError(_report(f"{name}: a rank process died", lines))
        if all(k == OK for k in kinds):
            return [replies[r][2] for r in range(self.world_size)]
        errors = [replies[r][2] for r in range(self.world_size) if kinds[r] == ERR]
        if len(errors) == self.world_size and len({(e[1], e[2]) for e in errors}) == 1:
            # All ranks agree: keep the pool, and raise the ranks' own exception type.
            blob, kind, message, text = errors[0]
            raise _rebuild(blob, kind, message) from RemoteTraceback(0, text)
        self._kill()
        lines = [_describe(replies[r], with_traceback=True) for r in range(self.world_size)]
        raise RankDivergenceError(
            _report(f"{name}: ranks ended differently (errors must be raised on every rank)", lines)
        )

    def _dump_stacks(self, ranks: list) -> dict:
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
        time.sleep(0.5)  # faulthandler writes from a signal handler; give it a moment
        stacks = {}
        for rank in ranks:
            path = os.path.join(self._tmpdir, f"stack-rank{rank}.txt")
            try:
                with open(path) as f:
                    text = _interesting_stack(f.read())
            except OSError:
                text = ["(no stack dump)"]
            shown = "\n    ".join(text[-_STACK_LINES:])
            stacks[rank] = f"still running, killed; its Python stack:\n    {shown}"
        return stacks


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None,
                    timeout_s: float = 60.0, **kwargs: Any) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` once on a fresh ``world_size``-rank pool (for scripts).

    Tests should share pools through the ``dist_pools`` fixture instead: starting one costs seconds.

    Example::

        results = run_distributed(add_ranks, 2)
    """
    with ProcessPool(world_size, backend) as pool:
        return pool.run(fn, *args, timeout_s=timeout_s, **kwargs)


@contextlib.contextmanager
def _environment(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _interesting_stack(dump: str) -> list:
    """The dump's lines minus the harness's own watchdog thread and process bootstrap frames."""
    blocks = [b for b in dump.strip().split("\n\n") if "in watch" not in b]
    noise = ("multiprocessing" + os.sep, 'File "<string>"')
    lines = [ln for b in blocks for ln in b.splitlines() if not any(n in ln for n in noise)]
    return lines or ["(empty stack dump)"]


def _rebuild(blob: bytes | None, kind: str, message: str) -> BaseException:
    if blob is not None:
        with contextlib.suppress(Exception):  # its class may not import in the parent
            return pickle.loads(blob)
    return RemoteRankError(kind, message)


def _describe(reply: tuple, with_traceback: bool = False) -> str:
    kind, _, body = reply
    if kind == OK:
        text = repr(body)
        return "returned " + (text if len(text) <= 200 else text[:200] + "...")
    if kind == "died":
        return f"process died with exit code {body}"
    if kind == READY:
        return "ready"
    _, type_name, message, text = body
    out = f"raised {type_name.removeprefix('builtins.')}: {message}"
    if with_traceback:
        out += "\n    " + "\n    ".join(text.rstrip().splitlines()[-12:])
    return out


def _report(headline: str, per_rank: list) -> str:
    return headline + "\n" + "\n".join(f"  rank {r}: {line}" for r, line in enumerate(per_rank))
