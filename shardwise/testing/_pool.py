"""Parent side of the test pool: spawn, dispatch, collect, diagnose, kill.

A pool is ``world_size`` worker processes (see ``_worker.py``) that joined one
world through a FileStore in a fresh temp dir, with the backend of the pool's
device (gloo for CPU, NCCL for CUDA). A pool that saw any
failure is killed: its process group may hold half-finished collectives.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path

from shardwise.testing._errors import DistributedTestError, DistributedTestTimeout

# Importing torch in N processes on a loaded 2-core machine is slow.
START_TIMEOUT_S = 180.0
# After the first failing rank, how long the others get before being killed:
# they are usually stuck in a collective the failed rank never entered.
FAILURE_GRACE_S = 3.0
# How long to wait for faulthandler output after SIGUSR1 / for a dead worker's
# exit status.
STACK_WAIT_S = 2.0
EXIT_WAIT_S = 5.0

_WORKER_BOOT = "from shardwise.testing._worker import main; main()"
# The directory holding the `shardwise` package, so workers can import it.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class Pool:
    """``world_size`` live workers; :meth:`run` one task on all of them."""

    def __init__(self, world_size: int, device_type: str = "cpu") -> None:
        self.world_size, self.device_type = world_size, device_type
        self.dir = tempfile.mkdtemp(prefix=f"shardwise-pool{world_size}-")
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        self.pids: list[int] = []
        try:
            for rank in range(world_size):
                self._spawn(rank)
            self._await_ready()
        except BaseException:
            self.kill()
            raise

    def _spawn(self, rank: int) -> None:
        parent_sock, child_sock = socket.socketpair()
        cmd = [sys.executable, "-c", _WORKER_BOOT, str(child_sock.fileno()), str(rank),
               str(self.world_size), os.path.join(self.dir, "store"),
               self._dump_path(rank), str(os.getpid())]
        try:
            proc = subprocess.Popen(
                cmd, pass_fds=(child_sock.fileno(),), env=self._env(rank),
                start_new_session=True,  # Ctrl-C goes to the parent, which cleans up
            )
        finally:
            child_sock.close()
        self.procs.append(proc)
        self.conns.append(Connection(parent_sock.detach()))

    def _env(self, rank: int) -> dict[str, str]:
        env = dict(os.environ)
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
        env.update(SHARDWISE_TEST_WORKER="1", RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(self.world_size), LOCAL_WORLD_SIZE=str(self.world_size),
                   SHARDWISE_TEST_DEVICE=self.device_type)
        # A different hash seed per rank: code whose collectives depend on hash() order fails here.
        env["PYTHONHASHSEED"] = str(101 + rank)
        # One thread per rank: the ranks already oversubscribe small machines.
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
        if sys.platform.startswith("linux"):
            # All ranks are local; loopback avoids hostname-resolution failures.
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        return env

    def _dump_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.stacks")

    def _await_ready(self) -> None:
        replies, failures = self._collect(START_TIMEOUT_S, grace=0.0)
        if not failures and len(replies) == self.world_size:
            self.pids = [replies[r][1] for r in range(self.world_size)]
            return
        for rank, reply in replies.items():
            if reply[0] == "start_error":
                failures[rank] = reply[1]
        pending = [r for r in range(self.world_size) if r not in replies and r not in failures]
        stacks = self.dump_stacks(pending)
        self.kill()
        what = f"worker pool of {self.world_size} failed to start"
        raise DistributedTestError(_report(what, failures, stacks), failures, stacks)

    def run(self, payload: bytes, timeout: float, label: str) -> list:
        """Run one pickled task on every rank; results in rank order."""
        offsets = [self._dump_size(r) for r in range(self.world_size)]
        task = pickle.dumps(("run", [p for p in sys.path if isinstance(p, str)],
                             os.getcwd(), payload), protocol=pickle.HIGHEST_PROTOCOL)
        dead = {}
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(task)
            except OSError:
                dead[rank] = self._death_report(rank, offsets[rank])
        replies, failures = self._collect(timeout, FAILURE_GRACE_S, offsets, skip=dead)
        failures.update(dead)
        for rank, reply in replies.items():
            if reply[0] == "error":
                failures[rank] = f"raised {reply[1]}: {reply[2]}\n{reply[3]}"
        if not failures and len(replies) == self.world_size:
            return [self._load(r, replies[r][1], label) for r in range(self.world_size)]
        return self._fail(replies, failures, timeout, label)

    def _fail(self, replies: dict, failures: dict, timeout: float, label: str):
        if failures:
            # Ranks that finished are idle; only the unfinished ones are news.
            unfinished = [r for r in range(self.world_size) if r not in replies and r not in failures]
            stacks = self.dump_stacks(unfinished)
            self.kill()
            what = f"{label} failed on rank(s) {sorted(failures)}"
            raise DistributedTestError(_report(what, failures, stacks), failures, stacks)
        stacks = self.dump_stacks(list(range(self.world_size)))
        self.kill()
        done = sorted(replies)
        what = (f"{label} timed out after {timeout:g} s; finished: {done}, "
                f"unfinished: {[r for r in range(self.world_size) if r not in replies]}")
        raise DistributedTestTimeout(_report(what, {}, stacks, done), {}, stacks)

    def _collect(self, timeout: float, grace: float, offsets: list[int] | None = None,
                 skip: dict | None = None) -> tuple[dict[int, tuple], dict[int, str]]:
        """Read one reply per rank until all are in or the deadline passes.

        The first failing rank moves the deadline to ``now + grace``."""
        offsets = offsets or [0] * self.world_size
        replies: dict[int, tuple] = {}
        failures: dict[int, str] = {}
        pending = {self.conns[r]: r for r in range(self.world_size) if r not in (skip or {})}
        deadline = time.monotonic() + timeout
        if skip:
            deadline = min(deadline, time.monotonic() + grace)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for conn in wait(list(pending), remaining):
                rank = pending.pop(conn)
                try:
                    replies[rank] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    failures[rank] = self._death_report(rank, offsets[rank])
                if rank in failures or replies[rank][0] in ("error", "start_error"):
                    deadline = min(deadline, time.monotonic() + grace)
        return replies, failures

    def _load(self, rank: int, data: bytes, label: str):
        try:
            return pickle.loads(data)
        except Exception as exc:
            # The pool itself is healthy: every rank finished.
            raise DistributedTestError(
                f"{label}: result of rank {rank} could not be unpickled in the parent "
                f"({type(exc).__name__}: {exc}); return plain data, tensors or classes "
                "importable from a module") from exc

    def _death_report(self, rank: int, offset: int) -> str:
        proc = self.procs[rank]
        try:
            code = proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            status = "closed its connection but did not exit"
        elif code < 0:
            status = f"was killed by signal {_signal_name(-code)}"
        else:
            status = f"exited with exit code {code}"
        text = f"worker process (pid {proc.pid}) {status}"
        dump = _drop_watchdog(self._read_dump(rank, offset))
        return text + (f"\nfaulthandler output:\n{dump}" if dump else "")

    def dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """SIGUSR1 each live rank (faulthandler dumps to its file); read them."""
        offsets = {r: self._dump_size(r) for r in ranks}
        signalled = []
        for rank in ranks:
            if self.procs[rank].poll() is None:
                try:
                    os.kill(self.procs[rank].pid, signal.SIGUSR1)
                    signalled.append(rank)
                except ProcessLookupError:
                    pass
        stacks = {r: "<process already exited: no stack>" for r in ranks if r not in signalled}
        stacks.update(self._await_dumps(signalled, offsets))
        return stacks

    def _await_dumps(self, ranks: list[int], offsets: dict[int, int]) -> dict[int, str]:
        # faulthandler writes from inside the signal handler; wait until each
        # file has grown and then stopped growing.
        deadline = time.monotonic() + STACK_WAIT_S
        last = {r: -1 for r in ranks}
        while time.monotonic() < deadline:
            sizes = {r: self._dump_size(r) for r in ranks}
            if all(sizes[r] > offsets[r] and sizes[r] == last[r] for r in ranks):
                break
            last = sizes
            time.sleep(0.05)
        return {r: _drop_watchdog(self._read_dump(r, offsets[r])) or "<no stack dumped in time>"
                for r in ranks}

    def _dump_size(self, rank: int) -> int:
        try:
            return os.path.getsize(self._dump_path(rank))
        except OSError:
            return 0

    def _read_dump(self, rank: int, offset: int) -> str:
        try:
            with open(self._dump_path(rank), "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def kill(self) -> None:
        """SIGKILL every worker, reap them and remove the temp dir."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        self._reap()

    def close(self) -> None:
        """Clean shutdown: closing the sockets makes idle workers exit."""
        for conn in self.conns:
            conn.close()
        deadline = time.monotonic() + EXIT_WAIT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        self._reap()

    def _reap(self) -> None:
        for proc in self.procs:
            try:
                proc.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                pass  # unkillable (D state); nothing more we can do
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _report(what: str, failures: dict[int, str], stacks: dict[int, str],
            finished: list[int] = ()) -> str:
    parts = [what]
    for rank in sorted(failures):
        parts.append(f"\n===== rank {rank} {failures[rank].rstrip()}")
    for rank in sorted(stacks):
        state = "finished (idle)" if rank in finished else "did not finish"
        parts.append(f"\n===== rank {rank} {state}; its Python stack:\n{stacks[rank]}")
    return "\n".join(parts)


def _drop_watchdog(dump: str) -> str:
    """Remove the worker's own parent-watch thread: it is in every dump."""
    blocks = dump.split("\n\n")
    kept = [b for b in blocks if not re.search(r'_worker\.py", line \d+ in watch\n', b + "\n")]
    return "\n\n".join(kept)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)
