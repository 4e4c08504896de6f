"""Checked mode: every rank verifies that all ranks of the mesh made the same redistribute call.

Collectives only work if every rank issues the same ones. When ranks ask ``redistribute`` for
different targets (a rank-dependent branch, a config read from a local file), they run mismatched
collectives and wait until the process group's timeout. In checked mode each ``redistribute`` (and
``full_tensor``) first reduces a 64-bit digest of the call -- source layout, target, shape, dtype,
and any argument error -- over every mesh dimension: one small all-reduce per mesh dim. Ranks that
disagree all raise the same ``ValueError`` naming each rank's request, before any data moves.

Off by default: the check costs a collective round trip per call. Turn it on while debugging, in
tests, or for a whole run with ``SHARDWISE_CHECK_RANKS=1`` in the environment.

>>> with rank_checks(True):                       # doctest: +SKIP
...     y = x.redistribute(mesh, [Replicate()])   # raises on every rank if another asked for S(1)
"""

from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ._switch import Switch

__all__ = ["rank_checks", "checks_enabled", "check_same_call"]


_CHECKS = Switch("rank_checks",
                  os.environ.get("SHARDWISE_CHECK_RANKS", "0") not in ("", "0", "false", "False"))


def checks_enabled() -> bool:
    return _CHECKS.enabled


def rank_checks(enabled: bool = True):
    """Turn checked mode on (or off) inside a ``with`` block; see the module docstring."""
    return _CHECKS.set(enabled)


def _digest(text: str) -> int:
    # a stable digest (never Python's per-process hash()), as a signed 64-bit value
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def check_same_call(mesh, what: str, request: str) -> None:
    """Raise ``ValueError`` on every rank of ``mesh`` unless all ranks passed the same ``request``.

    ``request`` is a printable description of this rank's call (including its own argument error,
    if any), so ranks that disagree can say who asked for what.
    """
    d = _digest(request)
    bounds = torch.tensor([d, -d], dtype=torch.int64, device=torch.device(mesh.device_type))
    for m in range(mesh.ndim):  # max of d and of -d over the whole mesh: equal iff every rank agrees
        bounds = funcol.wait_tensor(funcol.all_reduce(bounds, "max", mesh.get_group(m)))
    hi, neg_lo = bounds.tolist()
    if hi == -neg_lo:
        return
    seen = [(dist.get_rank(), request)]
    for m in range(mesh.ndim):  # gather along each mesh dim in turn: every rank ends with every request
        parts = [None] * mesh.size(m)
        dist.all_gather_object(parts, seen, group=mesh.get_group(m))
        seen = [item for part in parts for item in part]
    listing = "; ".join(f"rank {r}: {req}" for r, req in sorted(set(seen)))
    raise ValueError(
        f"{what}: ranks disagree ({listing}). Every rank of the mesh must make the same call with the "
        "same arguments; nothing was moved"
    )
