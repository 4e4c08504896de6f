"""Every rank of a mesh must describe one DTensor the same way: the checks behind ``distribute_tensor``
and ``DTensor.from_local(run_check=True)``.

Each rank first validates its own arguments and keeps any error as data, then all ranks compare a
64-bit digest of their description (one small all-reduce per mesh dimension, over the mesh's own
groups: a sub-mesh of an N-D mesh needs no new process group). Only when the digests differ are the
descriptions exchanged, as bytes in tensors (nothing is pickled), so that every rank raises the same
error naming each rank's value. An argument error that every rank shares is raised as it is.
``check_device`` is the one local check: a rank's piece must be on the mesh's device type.

>>> from shardwise.tensor import Shard, init_device_mesh
>>> check_distribute_call(torch.ones(4, 2), [Shard(0)], init_device_mesh("cpu", (1,)), 0)  # (placements, source)
((Shard(dim=0),), (0,))
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .agreement import gather_texts, same_everywhere
from ..collectives import mesh_gather_rows
from ..spec import local_shape_and_offset, mesh_coord, normalize_placements

__all__ = ["check_distribute_call", "check_from_local", "check_device"]

_SEP = "\x1f"  # joins the fields of a description (never part of a shape, dtype or placement)


def _normalized(placements, mesh: DeviceMesh, ndim: int) -> tuple:
    """(placements, None) or (None, "TypeError: message") for this rank's own arguments."""
    try:
        return normalize_placements(placements, mesh.ndim, ndim), None
    except (TypeError, ValueError) as e:
        return None, f"{type(e).__name__}{_SEP}{e}"


def _error(kind_and_message: str, prefix: str) -> Exception:
    kind, message = kind_and_message.split(_SEP, 1)
    return (TypeError if kind == "TypeError" else ValueError)(prefix + message)


def _src_coord(src_data_rank, mesh: DeviceMesh) -> tuple:
    """Coordinate of the ``src_data_rank``-th rank of the mesh (row-major, like ``mesh.mesh.flatten()``)."""
    if not isinstance(src_data_rank, int) or isinstance(src_data_rank, bool) or not 0 <= src_data_rank < mesh.size():
        raise ValueError(
            f"distribute_tensor(src_data_rank={src_data_rank!r}): must index one of the mesh's {mesh.size()} ranks "
            f"(0..{mesh.size() - 1}), or be None to keep each rank's own copy"
        )
    coord, rest = [], src_data_rank
    for size in reversed(tuple(mesh.shape)):
        coord.append(rest % size)
        rest //= size
    return tuple(reversed(coord))


def check_distribute_call(tensor: torch.Tensor, placements, mesh: DeviceMesh, src_data_rank) -> tuple:
    """Normalized placements and the source coordinate, once every rank of ``mesh`` passed the same shape,
    dtype, placements and ``src_data_rank``; otherwise the same ``ValueError``/``TypeError`` on every
    rank, before any data moves."""
    normalized, err = _normalized(placements, mesh, tensor.ndim)
    src = None
    if err is None:
        try:
            src = _src_coord(src_data_rank, mesh)
        except ValueError as e:
            err = f"ValueError{_SEP}{e}"
    fields = (str(tuple(tensor.shape)), str(tensor.dtype),
              "" if normalized is None else str(tuple(str(p) for p in normalized)), repr(src_data_rank), err or "")
    mine = _SEP.join(fields)
    if same_everywhere(mesh, mine):
        if err is not None:
            raise _error(err, "")
        return normalized, src
    seen = [(rank, text.split(_SEP)) for rank, text in gather_texts(mesh, mine)]
    for rank, f in seen:  # an argument error first: it explains the other differences
        if len(f) > 5:
            raise _error(_SEP.join(f[4:]), f"distribute_tensor, rank {rank}: ")
    first_rank, first = seen[0]
    for rank, f in seen[1:]:
        for what, a, b in zip(("shape", "dtype", "placements", "src_data_rank"), first, f):
            if a != b:
                raise ValueError(
                    f"distribute_tensor: ranks disagree on the {what}: rank {first_rank} has {a}, rank {rank} has "
                    f"{b}; every rank must pass the same full tensor layout (or use src_data_rank=None to keep "
                    "each rank's own copy, unchecked)"
                )
    raise AssertionError(f"distribute_tensor: digests differ but the descriptions agree: {seen}")


def check_from_local(local: torch.Tensor, mesh: DeviceMesh, placements) -> tuple:
    """``from_local(run_check=True)``: normalized placements and every rank's ``(rank, local shape,
    coordinate)`` sorted by rank, once all ranks agree on the number of dims, dtype, placements and
    requires_grad (as PyTorch's check_tensor_meta);
    otherwise the same error on every rank (a rank whose own arguments are bad names itself)."""
    normalized, err = _normalized(placements, mesh, local.ndim)
    pl = "" if normalized is None else str(tuple(str(p) for p in normalized))
    mine = _SEP.join((str(local.dtype), pl, str(local.ndim), str(local.requires_grad), err or ""))
    agreed = same_everywhere(mesh, mine)
    if not agreed:
        _raise_disagreement(gather_texts(mesh, mine))
    if err is not None:
        raise _error(err, f"from_local(run_check=True), rank {int(mesh.mesh.min())}: ")
    row = torch.tensor([dist.get_rank(), *mesh_coord(mesh), *local.shape], dtype=torch.int64)
    rows = sorted(mesh_gather_rows(row.to(torch.device(mesh.device_type)), mesh).cpu().tolist())
    n = mesh.ndim
    return normalized, [(r[0], tuple(r[1 + n:]), tuple(r[1:1 + n])) for r in rows]


def _raise_disagreement(texts: list) -> None:
    seen = [(rank, text.split(_SEP)) for rank, text in texts]
    for rank, f in seen:
        if len(f) > 5:
            raise _error(_SEP.join(f[4:]), f"from_local(run_check=True), rank {rank}: ")
    for what, i in (("dtype", 0), ("placements", 1), ("number of dimensions", 2), ("requires_grad", 3)):
        if len({f[i] for _, f in seen}) > 1:
            listing = "; ".join(f"rank {rank} has {f[i]}" for rank, f in seen)
            raise ValueError(f"from_local(run_check=True): ranks disagree on the {what} ({listing}); every rank "
                             f"must pass the same {what} for one DTensor")
    raise AssertionError(f"from_local(run_check=True): digests differ but the descriptions agree: {seen}")


def check_local_shapes(gathered, mesh: DeviceMesh, placements, shape: Optional[torch.Size]) -> None:
    """Every rank's local shape must match the global layout; the error names the bad ranks."""
    bad = []
    for rank, lshape, coord in gathered:
        expect = local_shape_and_offset(shape, tuple(mesh.shape), coord, placements)[0]
        if tuple(lshape) != tuple(expect):
            bad.append(f"rank {rank} has {tuple(lshape)}, expected {tuple(expect)}")
    if bad:
        raise ValueError(
            f"from_local(run_check=True): local shapes disagree with global shape {tuple(shape)} and placements "
            f"{[str(p) for p in placements]}: " + "; ".join(bad) + ". Pass the right shape= or fix the shards"
        )


def check_device(local: torch.Tensor, mesh: DeviceMesh, what: str) -> None:
    """Raise ``ValueError`` when this rank's piece is not on the mesh's device type (``from_local``)."""
    # a CPU mesh runs gloo on host memory, a CUDA mesh NCCL on device memory: a piece elsewhere
    # would fail later inside a collective, far from the cause; a meta piece (shapes only) is fine
    if local.device.type not in (mesh.device_type, "meta"):
        raise ValueError(
            f"{what}: the local tensor is on {local.device} but the mesh is a {mesh.device_type!r} mesh; move it "
            f"with .to({mesh.device_type!r}) first"
        )
