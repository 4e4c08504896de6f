"""Worker process of the test pool: one rank of a long-lived world (gloo on CPU, NCCL on CUDA).

Started by :mod:`shardwise.testing._pool` as
``python -c "from shardwise.testing._worker import main; main()" FD RANK
WORLD STORE DUMP PARENT_PID``. It joins the process group once, then serves
tasks sent over the socket FD until the parent closes it.

Wire protocol (every message is ``pickle.dumps`` of a tuple of builtins):
    parent -> worker: ``("run", sys_path, cwd, payload)`` where ``payload`` is
        ``pickle.dumps((fn, args, kwargs))``; unpickled only after
        ``sys_path`` is adopted so test modules import.
    worker -> parent: ``("ready", pid)`` | ``("start_error", text)`` |
        ``("ok", pickled_result)`` | ``("error", type_name, message, text)``.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection

# Collectives stuck longer than this raise inside the worker; the parent's
# per-call timeout (default 120 s) is longer so the worker's error usually wins.
PROCESS_GROUP_TIMEOUT_S = 60.0

# Kept at module level: faulthandler holds only the fd, the file must stay open.
_dump_file = None


def main() -> None:
    fd, rank, world_size, store_path, dump_path, parent_pid = sys.argv[1:7]
    rank, world_size = int(rank), int(world_size)
    conn = Connection(int(fd))
    _install_stack_dumps(dump_path)
    _watch_parent(int(parent_pid))
    try:
        _init_process_group(rank, world_size, store_path)
    except BaseException:  # noqa: BLE001 - anything here must reach the parent
        _send(conn, ("start_error", traceback.format_exc()))
        _exit(1)
    _send(conn, ("ready", os.getpid()))
    _serve(conn, rank, world_size)


def _install_stack_dumps(dump_path: str) -> None:
    """SIGUSR1 dumps all Python stacks (the parent's view into hangs); fatal
    signals append theirs too, so a segfaulting rank reports where it died."""
    global _dump_file
    # Append mode: the parent reads from the size it saw before signalling.
    _dump_file = open(dump_path, "a", buffering=1)  # noqa: SIM115
    faulthandler.enable(file=_dump_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=_dump_file, all_threads=True, chain=False)


def _watch_parent(parent_pid: int) -> None:
    """Exit when the parent dies, even if stuck in a collective."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="shardwise-parent-watch", daemon=True).start()


def _init_process_group(rank: int, world_size: int, store_path: str) -> None:
    import torch
    import torch.distributed as dist

    from shardwise._device import backend_for, local_device
    from shardwise.testing.harness import pool_device_type

    torch.set_num_threads(1)
    device_type = pool_device_type()  # the backend follows the device, never the other way round
    if device_type == "cuda":
        torch.cuda.set_device(local_device("cuda"))  # LOCAL_RANK (the parent checked one GPU per rank)
    dist.init_process_group(
        backend_for(device_type),
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=PROCESS_GROUP_TIMEOUT_S),
    )


def _serve(conn: Connection, rank: int, world_size: int) -> None:
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            _exit(0)  # parent closed the pool (or died): nothing left to do
        if message[0] != "run":
            _exit(0)
        reply = _run_task(message[1:], rank, world_size)
        if not _send(conn, reply):
            _exit(0)


def _run_task(task: tuple, rank: int, world_size: int) -> tuple:
    import torch

    sys_path, cwd, payload = task
    # Tests share these workers: undo the global torch state fn may change.
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    try:
        _adopt_path(sys_path)
        os.chdir(cwd)
        fn, args, kwargs = pickle.loads(payload)
        result = fn(rank, world_size, *args, **kwargs)
        return ("ok", pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException as exc:  # noqa: BLE001 - SystemExit is a failure too
        text = "".join(traceback.format_exception(exc))
        return ("error", type(exc).__qualname__, str(exc), text)
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        sys.stdout.flush()
        sys.stderr.flush()


def _adopt_path(parent_path: list[str]) -> None:
    """Parent's entries first, in its order; keep our own extras after."""
    extras = [p for p in sys.path if p not in parent_path]
    sys.path[:] = list(parent_path) + extras
    # Test files may have been written after this worker started.
    importlib.invalidate_caches()


def _send(conn: Connection, message: tuple) -> bool:
    try:
        conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        return True
    except (OSError, ValueError):
        return False


def _exit(code: int) -> None:
    # os._exit: interpreter teardown with live gloo threads can stall.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
