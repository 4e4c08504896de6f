"""What a worker takes from the machine it runs on: its device and its number of threads.

The device is ``cuda`` only when every local process can have a GPU of its own (NCCL refuses two
ranks on one GPU); each process then uses ``cuda:LOCAL_RANK``. Threads: the host's cores divided by
the ranks that really run on this host, counted with one all-gather of host names -- not from
``LOCAL_WORLD_SIZE``, which counts only one launcher's processes (two launchers on one host would
each take every core), nor from ``OMP_NUM_THREADS``, which torchrun sets to 1 whenever it starts more
than one process.

Example:
    >>> choose_device(None, local_processes=2, gpus=0)
    'cpu'
    >>> threads_per_process(cores=16, ranks_on_host=4)
    4
"""

from __future__ import annotations

import os
import socket
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["DEVICES", "choose_device", "local_device", "ranks_on_this_host", "threads_per_process", "host_cores"]

DEVICES = ("cuda", "cpu")
_NAME_BYTES = 255   # the length fits the one trailing byte


def choose_device(requested: Optional[str], local_processes: int, gpus: int) -> str:
    """``requested`` (``"cuda"``, ``"cpu"`` or None for automatic) checked against this machine.

    Automatic: ``cuda`` when there are at least as many GPUs as local processes, else ``cpu``.

    Example:
        >>> choose_device(None, local_processes=2, gpus=2), choose_device("cpu", 2, 8)
        ('cuda', 'cpu')
    """
    if requested not in (None, *DEVICES):
        raise ValueError(f"--device {requested!r} must be one of {DEVICES} (or left out to choose automatically)")
    if requested is None:
        return "cuda" if 0 < local_processes <= gpus else "cpu"
    if requested == "cuda" and gpus < local_processes:
        fix = f"run --nproc-per-node {gpus} or" if gpus else "use a machine with GPUs or pass"
        raise ValueError(f"--device cuda: {local_processes} processes on this machine but {gpus} GPU(s); NCCL "
                         f"refuses two ranks on one GPU: {fix} --device cpu")
    return requested


def local_device(device_type: str) -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` (made current) or ``cpu``."""
    if device_type == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def host_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ranks_on_this_host(device: torch.device, hostname: Optional[str] = None, group=None) -> int:
    """Collective: how many ranks of ``group`` run on this host (one all-gather of fixed-size names)."""
    name = (hostname if hostname is not None else socket.gethostname()).encode()[:_NAME_BYTES]
    mine = torch.zeros(_NAME_BYTES + 1, dtype=torch.uint8)
    mine[:len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    mine[-1] = len(name)   # a length byte, so a name is never a prefix of a longer one padded with zeros
    mine = mine.to(device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    return sum(1 for other in everyone if torch.equal(other, mine))


def threads_per_process(cores: int, ranks_on_host: int, explicit: Optional[int] = None) -> int:
    """``explicit`` (``--threads``) when given, else this host's cores shared by its ranks (at least 1)."""
    if explicit is not None:
        return explicit
    return max(1, cores // max(1, ranks_on_host))
