"""Collectives on one mesh dimension, over torch's functional collectives (traceable graph ops).

Every function takes the local tensor and (mesh, mesh_dim) and handles uneven ``torch.chunk`` shards
by padding to a full chunk before the collective and trimming after it. ``mesh_max``,
``mesh_gather_rows`` and ``mesh_broadcast_`` reach every rank of an N-D mesh by one collective per
mesh dimension over the mesh's own groups, so no call ever creates a process group.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401  (registers the ops' autograd and tracing kernels)
from torch.distributed.device_mesh import DeviceMesh

from .spec import chunk_range, mesh_coord

__all__ = ["all_reduce", "all_gather_dim", "reduce_scatter_dim", "all_to_all_dims", "mesh_max", "mesh_gather_rows",
           "mesh_broadcast_", "CollectiveCounter", "CollectiveTimeoutError"]


class CollectiveTimeoutError(RuntimeError):
    """A collective waited past the process group's timeout: some rank never joined it."""


@contextlib.contextmanager
def _explained(kind: str, mesh: DeviceMesh, mesh_dim: int):
    """Re-raise a backend timeout with what was waiting and how to find the cause (gloo's own
    message names neither the collective nor the setting)."""
    try:
        yield
    except RuntimeError as e:
        if "timed out" not in str(e).lower() and "timeout" not in str(e).lower():
            raise
        raise CollectiveTimeoutError(
            f"{kind} over mesh dim {mesh_dim} ({mesh.size(mesh_dim)} ranks) timed out: another rank never joined "
            "it or issued a different collective. The wait is the process group's timeout "
            "(init_process_group(timeout=...); `shardwise train --collective-timeout`). If ranks may ask "
            "redistribute for different layouts, run with SHARDWISE_CHECK_RANKS=1 to name them. "
            f"Backend error: {e}"
        ) from e


_get_dispatch_mode = torch._C._get_dispatch_mode
_in_tls, _get_tls = torch._C._is_key_in_tls, torch._C._get_obj_in_tls
_FAKE = torch._C._TorchDispatchModeKey.FAKE


class CollectiveCounter:
    """Counts the collectives that the code in its ``with`` block issues through this module, in this
    thread and in the backward passes it runs (also on autograd's device threads); not those of other
    threads (a test and benchmark aid). Collectives a torch.compile'd graph runs are not seen (nor
    counted while it is traced on fake tensors).

    >>> from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    >>> mesh = init_device_mesh("cpu", (1,)); x = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
    >>> with CollectiveCounter() as c:
    ...     y = x.redistribute(mesh, [Replicate()])
    >>> c.counts      # {'all_gather': 1} on a mesh of 2 ranks; one rank has nothing to gather
    {}
    """

    # the counters of the ``with`` blocks the running code is inside: per thread (a context variable), so a
    # counter sees the collectives of the code it wraps and not those another thread issues meanwhile
    _active: contextvars.ContextVar = contextvars.ContextVar("shardwise.collective_counters", default=())
    # blocks open in any thread: with none (the usual case) a collective skips the lookups below
    _open, _open_lock = 0, threading.Lock()

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.donated = 0  # reductions that ran in a donated buffer instead of a copy
        self._tokens: list = []

    def __enter__(self):
        self._tokens.append(CollectiveCounter._active.set(CollectiveCounter._active.get() + (self,)))
        with CollectiveCounter._open_lock:
            CollectiveCounter._open += 1
        return self

    def __exit__(self, *exc):
        CollectiveCounter._active.reset(self._tokens.pop())
        with CollectiveCounter._open_lock:
            CollectiveCounter._open -= 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @staticmethod
    def record(kind: str, donated: bool = False) -> None:
        # under fake tensors (torch.compile tracing) nothing is issued: the compiled graph runs it later
        if not CollectiveCounter._open:
            return
        active = CollectiveCounter._active.get()
        if not active and _in_tls("context"):
            # an autograd device thread (a CUDA backward) runs in a context of its own: torch stashes the
            # context of the thread that called backward() in its thread-local state, so count into that one
            active = (_get_tls("context") or contextvars.Context()).get(CollectiveCounter._active, ())
        if not active or _get_dispatch_mode(_FAKE) is not None:
            return
        for c in active:
            c.counts[kind] = c.counts.get(kind, 0) + 1
            c.donated += donated


_C10D_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
             "product": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
             "bxor": dist.ReduceOp.BXOR}


def _group(mesh: DeviceMesh, mesh_dim: int):
    return mesh.get_group(mesh_dim)


_PROCESS_GROUP = dist.ProcessGroup
_OPS = torch.ops._c10d_functional
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
_AS_IS = contextlib.nullcontext()


def _scope(x: torch.Tensor):
    """What the ops' autograd kernel (registered in Python by torch) does for an input that records
    nothing: run below autograd. Done here as one C++ guard instead of that kernel's Python layer, in
    eager code only (torch.compile traces the ops as they are)."""
    if (torch.is_grad_enabled() and x.requires_grad) or torch.compiler.is_compiling():
        return _AS_IS
    return _BELOW_AUTOGRAD()


class _FunctionalOps:
    """The functional collective ops called directly, as torch's functional collectives call them while
    tracing: the op, then its wait. Outside tracing, torch's Python API wraps each result in an
    AsyncCollectiveTensor whose wait is a subclass dispatch: about half the main-thread CPU time of a
    1 MiB all-reduce on 2 gloo ranks. Every call here waits at once, so the wrapper buys nothing; the
    ops, and so the graphs recorded under tracing, are the same. Only dim 0 is gathered/scattered."""

    @staticmethod
    def wait_tensor(t):
        with _scope(t):
            return _OPS.wait_tensor(t)

    @staticmethod
    def all_reduce(x, op: str, group):
        with _scope(x):
            return _OPS.all_reduce(x, op, group.group_name)

    @staticmethod
    def all_gather_single(x, gather_dim: int, group):
        assert gather_dim == 0, f"all_gather_single gathers dim 0 only, got {gather_dim}"
        with _scope(x):
            return _OPS.all_gather_into_tensor(x, group.size(), group.group_name)

    @staticmethod
    def reduce_scatter_single(x, op: str, scatter_dim: int, group):
        assert scatter_dim == 0, f"reduce_scatter_single scatters dim 0 only, got {scatter_dim}"
        with _scope(x):
            return _OPS.reduce_scatter_tensor(x, op, group.size(), group.group_name)

    @staticmethod
    def all_to_all_single(x, output_split_sizes, input_split_sizes, group):
        with _scope(x):
            return _OPS.all_to_all_single(x, output_split_sizes, input_split_sizes, group.group_name)


_DIRECT = _FunctionalOps()


def _apis(group) -> tuple:
    """(functional collectives, c10d) for ``group``: torch's ops, or the ones a group object brings
    itself (``simulated_collectives``: the rule validator's thread ranks, validate/thread_ranks.py).
    Chosen by the group a call is given, so a simulation never replaces anything another caller sees."""
    if isinstance(group, _PROCESS_GROUP):
        return _DIRECT, dist
    return getattr(group, "simulated_collectives", None) or (_DIRECT, dist)


def _pad_dim(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if x.shape[dim] == size:
        return x
    pad_shape = list(x.shape)
    pad_shape[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad_shape)], dim=dim)


def all_reduce(
    x: torch.Tensor, reduce_op: str, mesh: DeviceMesh, mesh_dim: int, *, inplace: bool = False
) -> torch.Tensor:
    """Reduce over one mesh dim. ``inplace`` reuses ``x``'s buffer (the caller donates it: see
    donation.py); otherwise the result is a new tensor and ``x`` is untouched."""
    inplace = inplace and x.is_contiguous()
    CollectiveCounter.record("all_reduce", donated=inplace)
    # gloo has no AVG: reduce with SUM and scale
    op = "sum" if reduce_op == "avg" else reduce_op
    group = _group(mesh, mesh_dim)
    fc, c10d = _apis(group)
    if inplace:
        # the c10d op itself: donation never happens under tracing, and the functional in-place op
        # costs a Python autograd layer per call
        with _explained("all_reduce", mesh, mesh_dim):
            c10d.all_reduce(x, op=_C10D_OPS[op], group=group)
        return x.div_(mesh.size(mesh_dim)) if reduce_op == "avg" else x
    with _explained("all_reduce", mesh, mesh_dim):
        out = fc.wait_tensor(fc.all_reduce(x.contiguous(), op, group))
    if reduce_op == "avg":
        out = out / mesh.size(mesh_dim)
    return out


def all_gather_dim(x: torch.Tensor, dim: int, full: int, mesh: DeviceMesh, mesh_dim: int) -> torch.Tensor:
    """Gather chunks of a dimension of global size ``full`` (each rank holds its torch.chunk piece)."""
    CollectiveCounter.record("all_gather")
    n = mesh.size(mesh_dim)
    chunk = -(-full // n) if full else 0
    padded = _pad_dim(x, dim, chunk).contiguous()
    group = _group(mesh, mesh_dim)
    fc = _apis(group)[0]
    with _explained("all_gather", mesh, mesh_dim):
        out = fc.wait_tensor(fc.all_gather_single(padded, 0, group))
    if dim != 0:
        out = torch.cat(torch.chunk(out, n, dim=0), dim=dim)
    # trimming the padding of an inner dim leaves a strided view; views downstream need contiguous
    return out.narrow(dim, 0, full).contiguous() if chunk * n != full else out


def reduce_scatter_dim(
    x: torch.Tensor, reduce_op: str, dim: int, mesh: DeviceMesh, mesh_dim: int, coord: int
) -> torch.Tensor:
    """Reduce partial values and keep this rank's torch.chunk piece of ``dim``."""
    n = mesh.size(mesh_dim)
    full = x.shape[dim]
    start, length = chunk_range(full, n, coord)
    if reduce_op not in ("sum", "avg"):  # gloo reduce-scatters sums only
        return all_reduce(x, reduce_op, mesh, mesh_dim).narrow(dim, start, length)
    CollectiveCounter.record("reduce_scatter")
    chunk = -(-full // n)
    if chunk == 0:
        return x
    padded = _pad_dim(x, dim, chunk * n)
    if dim != 0:
        # stack the n chunks of `dim` along dim 0 so the collective scatters them in rank order
        padded = torch.cat(torch.chunk(padded, n, dim=dim), dim=0)
    group = _group(mesh, mesh_dim)
    fc = _apis(group)[0]
    with _explained("reduce_scatter", mesh, mesh_dim):
        out = fc.wait_tensor(fc.reduce_scatter_single(padded.contiguous(), "sum", 0, group))
    if reduce_op == "avg":
        out = out / n
    return out.narrow(dim, 0, length) if length != chunk else out


def all_to_all_dims(
    x: torch.Tensor, src_dim: int, dst_dim: int, src_full: int, mesh: DeviceMesh, mesh_dim: int, coord: int
) -> torch.Tensor:
    """Shard(src_dim) -> Shard(dst_dim): gather ``src_dim`` (global size ``src_full``) while splitting
    ``dst_dim``, in one all-to-all."""
    CollectiveCounter.record("all_to_all")
    n = mesh.size(mesh_dim)
    src_chunk = -(-src_full // n) if src_full else 0
    dst_full = x.shape[dst_dim]
    dst_chunk = -(-dst_full // n) if dst_full else 0
    if dst_chunk == 0 or src_full == 0:  # nothing to move: only the local shape changes
        shape = list(x.shape)
        shape[src_dim] = src_full
        shape[dst_dim] = chunk_range(dst_full, n, coord)[1]
        return x.new_empty(shape)
    x = _pad_dim(_pad_dim(x, src_dim, src_chunk), dst_dim, dst_chunk * n)
    pieces = torch.stack(torch.chunk(x, n, dim=dst_dim), dim=0).contiguous()
    split = [pieces.shape[0] // n] * n
    group = _group(mesh, mesh_dim)
    fc = _apis(group)[0]
    # gloo has no complex all-to-all: move complex values as (real, imag) pairs of the real dtype
    wire = torch.view_as_real(pieces) if pieces.is_complex() else pieces
    with _explained("all_to_all", mesh, mesh_dim):
        out = fc.wait_tensor(fc.all_to_all_single(wire, split, split, group))
    if pieces.is_complex():
        out = torch.view_as_complex(out)
    # out[k] is rank k's src chunk of my dst piece; concatenating along src_dim rebuilds that dim
    out = torch.cat(out.unbind(0), dim=src_dim).narrow(src_dim, 0, src_full)
    _, length = chunk_range(dst_full, n, coord)
    return out.narrow(dst_dim, 0, length) if length != out.shape[dst_dim] else out


# --- over every rank of a mesh, one mesh dimension at a time --------------------------------------

def mesh_max(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Element-wise max of ``x`` over every rank of ``mesh`` (a new tensor): the max along mesh dim 0,
    then of those along dim 1, ... is the max over the whole mesh."""
    for m in range(mesh.ndim):
        fc = _apis(_group(mesh, m))[0]
        with _explained("all_reduce", mesh, m):
            x = fc.wait_tensor(fc.all_reduce(x, "max", _group(mesh, m)))
    return x


def mesh_gather_rows(row: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Every rank's 1-D ``row`` (the same length everywhere) stacked into ``(mesh.size(), len)``: gathered
    along mesh dim 0, then those blocks along dim 1, ... Rows are in no promised order: put the rank in
    the row and sort by it."""
    rows = row.reshape(1, -1)
    for m in range(mesh.ndim):
        fc = _apis(_group(mesh, m))[0]
        with _explained("all_gather", mesh, m):
            rows = fc.wait_tensor(fc.all_gather_single(rows.contiguous(), 0, _group(mesh, m)))
    return rows


def mesh_broadcast_(x: torch.Tensor, mesh: DeviceMesh, src_coord: tuple) -> torch.Tensor:
    """In place: ``x`` of the mesh rank at coordinate ``src_coord``, on every rank of ``mesh``.

    Along mesh dim ``m`` only the groups whose coordinates after ``m`` are the source's broadcast, from
    their member at ``src_coord[m]``, which holds the data after the earlier dims. Every member of a
    group shares those coordinates, so a group broadcasts or skips as a whole; each rank receives once.
    """
    coord = mesh_coord(mesh)
    for m in range(mesh.ndim):
        if coord[m + 1:] != tuple(src_coord[m + 1:]):
            continue
        at = list(coord)
        at[m] = src_coord[m]
        with _explained("broadcast", mesh, m):
            dist.broadcast(x, src=int(mesh.mesh[tuple(at)]), group=_group(mesh, m))
    return x
