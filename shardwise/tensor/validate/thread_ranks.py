"""Simulated collectives for the rule validator: ranks as threads of one process.

Local kernels that issue collectives (through ``shardwise.tensor.collectives``) can then be checked
on simulated ranks too. Each rank runs in its own thread with a mesh whose ``get_group`` returns a
shared ``SimGroup``; ``collectives.py`` sees that the group brings its own collectives
(``simulated_collectives``: exchanges through the group, written from the definitions of the
collectives, independently of the code under test) and uses them for that call only. Nothing
process-wide is replaced, so real collectives elsewhere are untouched while the validator runs.

>>> import torch
>>> from shardwise.tensor.collectives import all_reduce
>>> def kernel(rank, mesh):
...     return all_reduce(torch.tensor([float(rank)]), "max", mesh, 0)
>>> [t.item() for t in run_ranks(3, kernel)]
[2.0, 2.0, 2.0]
"""

from __future__ import annotations

import itertools
import math
import threading

import torch
import torch.distributed

__all__ = ["SimGroup", "NotSimulated", "run_ranks"]

_local = threading.local()
_TIMEOUT_S = 20.0


class NotSimulated(RuntimeError):
    """A kernel used a communication API the simulation does not provide: it needs real ranks."""


class SimGroup:
    """The ranks along one mesh dimension (the others' coordinates fixed); ``exchange`` is an
    all-gather of Python values in coordinate order."""

    def __init__(self, size: int, mesh_dim: int = 0):
        self.size, self.mesh_dim = size, mesh_dim
        self.barrier = threading.Barrier(size, timeout=_TIMEOUT_S)
        self.slots: list = [None] * size

    @property
    def rank(self) -> int:
        return _local.coord[self.mesh_dim]

    def exchange(self, value) -> list:
        self.slots[self.rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return out

    def __getattr__(self, name):  # a real process-group method: c10d code the simulation bypasses
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotSimulated(f"process-group call {name!r} is not simulated")


def _reduce(tensors, op: str) -> torch.Tensor:
    st = torch.stack(tensors)
    if op == "sum":
        return st.sum(0).to(st.dtype)
    if op in ("max", "min"):
        return st.amax(0) if op == "max" else st.amin(0)
    raise ValueError(f"simulated all_reduce: reduce op {op!r} is not one of sum/max/min")


class _Funcol:
    """The functional collectives ``collectives.py`` uses, on SimGroups."""

    @staticmethod
    def wait_tensor(t):
        return t

    @staticmethod
    def all_reduce(x, op, group: SimGroup):
        return _reduce(group.exchange(x.clone()), op)

    @staticmethod
    def all_gather_single(x, gather_dim, group: SimGroup):
        return torch.cat(group.exchange(x.clone()), dim=gather_dim)

    @staticmethod
    def reduce_scatter_single(x, op, scatter_dim, group: SimGroup):
        total = _reduce(group.exchange(x.clone()), op)
        return torch.chunk(total, group.size, dim=scatter_dim)[group.rank].clone()

    @staticmethod
    def all_to_all_single(x, output_split_sizes, input_split_sizes, group: SimGroup):
        pieces = group.exchange(list(torch.split(x, list(input_split_sizes), dim=0)))
        return torch.cat([pieces[src][group.rank] for src in range(group.size)], dim=0)

    def __getattr__(self, name):
        raise NotSimulated(f"functional collective {name!r} is not simulated (add it to thread_ranks._Funcol)")


class _Done:
    @staticmethod
    def wait(*args, **kwargs):
        return True


class _Dist:
    """``torch.distributed`` with its in-place c10d collectives acting on SimGroups; everything else
    (ReduceOp, other groups) goes to the real module."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _op(self, op) -> str:
        for name in ("SUM", "MAX", "MIN", "AVG"):
            if op is None and name == "SUM" or op == getattr(self._real.ReduceOp, name):
                return name.lower()
        raise NotSimulated(f"reduce op {op} is not simulated")

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        if not isinstance(group, SimGroup):
            return self._real.all_reduce(tensor, op if op is not None else self._real.ReduceOp.SUM, group, async_op)
        name = self._op(op)
        total = _reduce(group.exchange(tensor.clone()), "sum" if name == "avg" else name)
        tensor.copy_(total / group.size if name == "avg" else total)
        return _Done() if async_op else None

    def all_gather_into_tensor(self, output, input, group=None, async_op=False):
        output.copy_(torch.cat(group.exchange(input.clone()), dim=0))
        return _Done() if async_op else None

    def reduce_scatter_tensor(self, output, input, op=None, group=None, async_op=False):
        total = _reduce(group.exchange(input.clone()), self._op(op))
        output.copy_(torch.chunk(total, group.size, dim=0)[group.rank])
        return _Done() if async_op else None

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        splits = list(input_split_sizes) if input_split_sizes else [input.shape[0] // group.size] * group.size
        pieces = group.exchange(list(torch.split(input, splits, dim=0)))
        output.copy_(torch.cat([pieces[src][group.rank] for src in range(group.size)], dim=0))
        return _Done() if async_op else None


# what shardwise.tensor.collectives calls on a SimGroup (see collectives._apis)
SimGroup.simulated_collectives = (_Funcol(), _Dist(torch.distributed))


class _ThreadMesh:
    """A mesh as one simulated rank (at ``coord``) sees it."""

    def __init__(self, mesh_shape: tuple, coord: tuple, groups: list):
        self.shape, self.ndim = tuple(mesh_shape), len(mesh_shape)
        self._coord, self._groups = coord, groups

    def size(self, dim=None) -> int:
        return math.prod(self.shape) if dim is None else self.shape[dim]

    def get_group(self, mesh_dim: int = 0) -> SimGroup:
        return self._groups[mesh_dim]

    def get_coordinate(self):
        return list(self._coord)


def run_ranks(mesh_shape, fn) -> list:
    """``[fn(rank, mesh) for every rank]`` with each rank in its own thread and collectives simulated;
    a rank is an int on an int (1-D) ``mesh_shape``, else its coordinate tuple. The first exception
    (in rank order) is raised after every thread has stopped."""
    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    ranks = list(itertools.product(*(range(n) for n in shape)))
    groups: dict = {}
    for c in ranks:  # one group per mesh dim and fixed other coordinates
        for m, n in enumerate(shape):
            groups.setdefault((m, c[:m] + c[m + 1:]), SimGroup(n, m))
    results, errors = [None] * len(ranks), [None] * len(ranks)

    def body(i, c):
        _local.coord = c
        mine = [groups[(m, c[:m] + c[m + 1:])] for m in range(len(shape))]
        try:
            results[i] = fn(c[0] if isinstance(mesh_shape, int) else c, _ThreadMesh(shape, c, mine))
        except BaseException as e:  # noqa: BLE001  (re-raised below; stop the other ranks' waits)
            errors[i] = e
            for g in groups.values():
                g.barrier.abort()

    threads = [threading.Thread(target=body, args=(i, c), daemon=True) for i, c in enumerate(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results
