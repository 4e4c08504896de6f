"""Run one bad-input case on every rank and report what each rank saw.

A case is a module-level builder ``build(rank, world) -> (call, state)``: ``call()`` is the bad call,
``state`` is whatever it could corrupt (modules, optimizers, sharded collections, checkpoint folders).
The runner digests ``state`` before and after, so a call that raises half-way through a mutation is
caught even when the error itself is right.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch


def _tensor_bytes(t: torch.Tensor) -> bytes:
    from shardwise.tensor import DTensor

    if isinstance(t, DTensor):
        t = t._local_tensor
    elif hasattr(t, "local_shards"):
        # a ShardedTable: its wrapper has no storage; the local blocks are the data
        return b"".join(repr(off).encode() + _tensor_bytes(x) for off, x in t.local_shards())
    t = t.detach().cpu().contiguous()
    return repr((tuple(t.shape), t.dtype)).encode() + t.view(-1).view(torch.uint8).numpy().tobytes()


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        h.update(_tensor_bytes(obj))
    elif isinstance(obj, dict):
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _feed(h, x)
    elif isinstance(obj, torch.nn.Module):
        _feed(h, obj.state_dict())
    elif isinstance(obj, torch.optim.Optimizer):
        _feed(h, obj.state_dict())
    elif hasattr(obj, "state_dict"):   # fused optimizers
        _feed(h, obj.state_dict())
    elif isinstance(obj, Path):
        for p in sorted(obj.rglob("*")):
            h.update(str(p.relative_to(obj)).encode())
            if p.is_file():
                h.update(p.read_bytes())
    else:
        h.update(repr(obj).encode())


def digest(state) -> str:
    """A hash of every tensor (this rank's shards) and file reachable from ``state``."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def run_case(rank: int, world: int, module: str, name: str) -> dict:
    """Build case ``name`` from ``module``, make the bad call, return what happened on this rank."""
    import importlib

    torch.manual_seed(0)
    build = getattr(importlib.import_module(module), name)
    call, state = build(rank, world)
    before = digest(state)
    kind = msg = None
    mro = []
    try:
        call()
    except (Exception, BaseException) as e:   # DCP raises CheckpointException, a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        kind, msg, mro = type(e).__name__, str(e), [c.__name__ for c in type(e).__mro__]
    try:
        after = digest(state)
    except Exception as e:   # state that needs a collective to read, after a group timed out
        after = f"unreadable: {e}"
    return {"rank": rank, "kind": kind, "msg": msg, "mro": mro, "unchanged": after == before, "pid": os.getpid()}


def check_rows(results: list, exc: type, fragment: str) -> None:
    """Every rank raised ``exc`` with the same message containing ``fragment``, state unchanged."""
    kinds = [(r["kind"], r["msg"]) for r in results]
    assert all(k is not None for k, _ in kinds), f"some rank did not raise: {kinds}"
    assert len(set(kinds)) == 1, f"ranks disagree on the error: {kinds}"
    kind, msg = kinds[0]
    assert exc.__name__ in results[0]["mro"], f"expected {exc.__name__}, got {kind}: {msg}"
    assert fragment.lower() in msg.lower(), f"{fragment!r} not in {msg!r}"
    changed = [r["rank"] for r in results if not r["unchanged"]]
    assert not changed, f"state changed on ranks {changed} although the call raised: {msg}"


def short_timeout_mesh(seconds: float = 3.0):
    """A 1-D mesh over every rank whose gloo group gives up after ``seconds``.

    A rank left waiting in a collective then fails with gloo's timeout error instead of blocking the
    worker until the harness kills the pool, so a hang is reported (and costs seconds) like any
    other disagreement between ranks. Collective: every rank must call it in the same order.
    """
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from shardwise._device import backend_for
    from shardwise.testing import pool_device_type

    device_type = pool_device_type()  # the pool's device; its backend follows
    group = dist.new_group(list(range(dist.get_world_size())), timeout=timedelta(seconds=seconds),
                           backend=backend_for(device_type))
    return DeviceMesh.from_group(group, device_type)
