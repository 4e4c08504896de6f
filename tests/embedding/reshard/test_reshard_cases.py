"""Reshard corner cases: forwards before it with another feature order, a rank keeping part of a
changed table (gloo self-send), exact bytes on the wire, and invalid changes leaving state untouched."""

from __future__ import annotations

import functools
import hashlib

import torch

from shardwise.embedding import (
    column_wise, data_parallel, reshard, row_wise, shard, table_row_wise, table_wise,
)
from shardwise.testing import run_on_ranks

from .. import common
from .test_reshard import fresh_like, full_state, train
from ..workers import mesh_for

ADAM = functools.partial(torch.optim.Adam, lr=0.05)


def _reordered(kjt, keys):
    """The same batch with its features in ``keys`` order."""
    perm = [kjt.keys().index(k) for k in keys]
    return kjt.permute(perm)


def forward_then_reorder(rank, world):
    mesh = mesh_for(world, 1)
    ebc = common.make_ebc(seed=7)
    plan = {"t_a": table_wise(0), "t_b": data_parallel(), "t_tiny": row_wise(), "t_c": column_wise([1, 0])}
    mod = shard(ebc, plan, mesh=mesh, optimizer=ADAM)
    kjt = common.make_batch(50 + rank, 3, False)
    keys = sorted(kjt.keys())
    for _ in range(2):   # forwards (and a training step) before the reshard, one key order
        mod(_reordered(kjt, keys)).values().sum().backward()
    changes = {"t_a": row_wise([1, 0]), "t_b": table_wise(1), "t_tiny": column_wise([0, 1]),
               "t_c": table_row_wise(0)}
    reshard(mod, changes)
    fresh = fresh_like(ebc, full_state(mod), {**plan, **changes}, mesh, torch.float32)
    out = []
    for order in (keys[::-1], keys[1:] + keys[:1]):
        batch = _reordered(kjt, order)
        got, want = mod(batch), fresh(batch)
        out.append(got.keys() == want.keys() and torch.equal(got.values(), want.values()))
    return out


def test_forwards_before_and_feature_order_change():
    assert run_on_ranks(forward_then_reorder, 2, timeout=120.0) == [[True, True]] * 2


def keep_part(rank, world):
    """Rank 0 keeps part of each changed table; the wire carries only the rest (exact byte counts)."""
    mesh = mesh_for(world, 1)
    mod = shard(common.make_ebc(seed=8), {"t_a": table_wise(0), "t_b": row_wise([0, 1]), "t_tiny": table_wise(1),
                                          "t_c": column_wise([0, 1])}, mesh=mesh, optimizer=ADAM)
    train(mod, rank, world, 1)
    before = full_state(mod)
    stats = reshard(mod, {"t_a": row_wise([0, 1]), "t_c": column_wise([0])})
    after = full_state(mod)
    return {"sent": stats.bytes_sent, "recv": stats.bytes_received, "local": stats.bytes_local,
            "moved": stats.tables_moved, "same": all(torch.equal(before[k], after[k]) for k in before)}


def test_rank_keeps_part_of_a_changed_table_on_gloo():
    r0, r1 = run_on_ranks(keep_part, 2, timeout=120.0)
    # 3 tensors per element with Adam (weight, exp_avg, exp_avg_sq), 4 bytes each.
    # t_a 11x4 table-wise on 0 -> rows 0..5 stay on 0, rows 6..10 go to 1: 5*4 elements.
    # t_c 9x5 columns [0,3) on 0, [3,5) on 1 -> all on 0: 9*2 elements come from rank 1.
    per = 3 * 4
    assert r0["sent"] == r1["sent"] == [5 * 4 * per, 9 * 2 * per]
    assert r0["recv"] == [9 * 2 * per, 5 * 4 * per]
    assert r0["local"] == (6 * 4 + 9 * 3) * per and r1["local"] == 0
    assert r0["moved"] == ["t_a", "t_c"] and r0["same"] and r1["same"]


def _digest(state: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def invalid_changes(rank, world):
    mesh = mesh_for(world, 1)
    mod = shard(common.make_ebc(seed=9), common.plans(world)["mixed"], mesh=mesh, optimizer=ADAM)
    train(mod, rank, world, 1)
    cases = {
        "unknown": {"t_zz": row_wise()},
        "rank": {"t_a": table_wise(world)},
        "differ": {"t_a": table_wise(rank)},
        "type": {"t_a": "row_wise"},
        "not_dict": [("t_a", row_wise())],
        "cw_too_wide": {"t_tiny": column_wise(list(range(world)) + [world])},
        "memory": {"t_a": data_parallel()},
    }
    out = {}
    for name, changes in cases.items():
        before, groups = _digest(full_state(mod)), list(mod._groups)
        try:
            kw = {"max_bytes_per_rank": 100} if name == "memory" else {}
            reshard(mod, changes, **kw)
            out[name] = None
        except (ValueError, TypeError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
        untouched = _digest(full_state(mod)) == before and [id(g) for g in mod._groups] == [id(g) for g in groups]
        out[name] = (out[name], untouched)
    # the module still works and reshards after all the refusals
    reshard(mod, {"t_a": table_wise(world - 1)})
    train(mod, rank, world, 1, first=1)
    return out


def test_invalid_changes_raise_everywhere_and_change_nothing():
    for world in (2, 3):
        results = run_on_ranks(invalid_changes, world, timeout=120.0)
        for name, (msg, untouched) in results[0].items():
            assert msg is not None, f"{name}: no error"
            assert untouched, f"{name}: state changed"
            assert all(r[name] == results[0][name] for r in results), f"{name}: errors differ across ranks"
        assert "unknown tables" in results[0]["unknown"][0]
        assert "differ across ranks" in results[0]["differ"][0]
        assert results[0]["not_dict"][0].startswith("TypeError")
        assert "max_bytes_per_rank" in results[0]["memory"][0]


def no_optimizer(rank, world):
    """A collection sharded without an optimizer reshards its weights alone."""
    mesh = mesh_for(world, 1)
    ebc = common.make_ebc(seed=10)
    mod = shard(ebc, common.plans(world)["mixed"], mesh=mesh)
    changes = {"t_a": column_wise([1, 0]), "t_c": table_wise(0), "t_b": row_wise([1])}
    stats = reshard(mod, changes)
    kjt = common.make_batch(60 + rank, 3, False)
    want = ebc(kjt).values()
    return stats.tables_moved, (mod(kjt).values() - want).abs().max().item()


def test_reshard_without_optimizer():
    for moved, err in run_on_ranks(no_optimizer, 2, timeout=120.0):
        assert moved == ["t_a", "t_b", "t_c"] and err < 1e-6
