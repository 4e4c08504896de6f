"""Checked mode: every rank verifies that all ranks of the mesh made the same redistribute call.

Collectives only work if every rank issues the same ones. When ranks ask ``redistribute`` for
different targets (a rank-dependent branch, a config read from a local file), they run mismatched
collectives and wait until the process group's timeout. In checked mode each ``redistribute`` (and
``full_tensor``) first reduces a 64-bit digest of the call -- source layout, target, shape, dtype,
and any argument error -- over every mesh dimension: one small all-reduce per mesh dim. Ranks that
disagree all raise the same ``ValueError`` naming each rank's request, before any data moves.

Off by default: the check costs a collective round trip per call. Turn it on while debugging, in
tests, or for a whole run with ``SHARDWISE_CHECK_RANKS=1`` in the environment.

>>> import torch; from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh, rank_checks
>>> mesh = init_device_mesh("cpu", (1,)); x = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
>>> with rank_checks(True):
...     y = x.redistribute(mesh, [Replicate()])   # raises on every rank if another asked for S(1)
"""

from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist

from .._switch import Switch
from ..collectives import mesh_gather_rows, mesh_max

__all__ = ["rank_checks", "checks_enabled", "check_same_call", "same_everywhere", "gather_texts"]


_CHECKS = Switch("rank_checks",
                  os.environ.get("SHARDWISE_CHECK_RANKS", "0") not in ("", "0", "false", "False"))


def checks_enabled() -> bool:
    return _CHECKS.get()


def rank_checks(enabled: bool = True):
    """Turn checked mode on (or off) inside a ``with`` block, in this thread or task only; see the
    module docstring."""
    return _CHECKS.set(enabled)


def _digest(text: str) -> int:
    # a stable digest (never Python's per-process hash()), as a signed 64-bit value
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def same_everywhere(mesh, text: str) -> bool:
    """Whether every rank of ``mesh`` passed the same ``text`` (one 16-byte all-reduce per mesh dim)."""
    d = _digest(text)
    bounds = torch.tensor([d, -d], dtype=torch.int64, device=torch.device(mesh.device_type))
    hi, neg_lo = mesh_max(bounds, mesh).tolist()  # max of d and of -d: equal iff every rank agrees
    return hi == -neg_lo


def gather_texts(mesh, text: str) -> list[tuple[int, str]]:
    """``(rank, text)`` of every rank of ``mesh``, sorted by rank. Tensor collectives only: the UTF-8
    bytes travel padded to the longest text, nothing is pickled. For error reports (two rounds)."""
    device = torch.device(mesh.device_type)
    data = list(text.encode())
    longest = int(mesh_max(torch.tensor([len(data)], dtype=torch.int64, device=device), mesh).item())
    row = torch.tensor([dist.get_rank(), len(data)] + data + [0] * (longest - len(data)), dtype=torch.int64)
    rows = mesh_gather_rows(row.to(device), mesh).cpu().tolist()
    return sorted((r[0], bytes(r[2:2 + r[1]]).decode()) for r in rows)


def check_same_call(mesh, what: str, request: str) -> None:
    """Raise ``ValueError`` on every rank of ``mesh`` unless all ranks passed the same ``request``.

    ``request`` is a printable description of this rank's call (including its own argument error,
    if any), so ranks that disagree can say who asked for what.
    """
    if same_everywhere(mesh, request):
        return
    listing = "; ".join(f"rank {r}: {req}" for r, req in gather_texts(mesh, request))
    raise ValueError(
        f"{what}: ranks disagree ({listing}). Every rank of the mesh must make the same call with the "
        "same arguments; nothing was moved"
    )
