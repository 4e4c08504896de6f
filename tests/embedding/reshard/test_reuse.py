"""New stores taking over old buffers of the same shape: swaps move no kept byte and allocate nothing,
and where the loop's order cannot keep a read of old bytes before the write onto them, the buffer
gets fresh memory -- bit for bit the same result either way."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from shardwise.embedding import (EmbeddingBagCollection, EmbeddingBagConfig, column_wise, reshard, row_wise, shard,
                                 table_wise)
from shardwise.embedding.reshard.executor import Item, Message, _order
from shardwise.sparse import KeyedJaggedTensor
from shardwise.testing import run_on_ranks

from ..workers import mesh_for
from .test_reshard import bits_equal, full_state

ADAM = functools.partial(torch.optim.Adam, lr=0.05)
DIM = 16                       # 64-byte rows: with chunk_bytes=64 every row is its own message
# (name, rows): u* have equal shapes; v* pair 2-row and 6-row tables so a swap lands rows out of order
TABLES = [("u0", 6), ("u1", 6), ("u2", 6), ("u3", 6), ("v0", 2), ("v1", 6), ("v2", 6), ("v3", 2)]
ROW_MAX = 4 * DIM


def _ebc() -> EmbeddingBagCollection:
    return EmbeddingBagCollection([EmbeddingBagConfig(rows, DIM, n, feature_names=[f"f{n}"]) for n, rows in TABLES],
                                  init_seed=5)


def _batch(seed: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    keys = [f"f{n}" for n, _ in TABLES]
    lengths = torch.randint(1, 3, (len(keys) * 2,), generator=g)
    values = torch.cat([torch.randint(0, rows, (int(lengths[2 * i + j]),), generator=g)
                        for i, (_, rows) in enumerate(TABLES) for j in range(2)])
    return KeyedJaggedTensor(keys, values, lengths=lengths, stride=2)


# plan A, changes: every u table changes rank; two u tables swap while two stay; column blocks swap;
# v tables swap ranks with their rows in another order (receives outrun sends at 64-byte messages)
CASES = {
    "swap_all": ({n: table_wise(i % 2) for i, (n, _) in enumerate(TABLES)},
                 {n: table_wise((i + 1) % 2) for i, (n, _) in enumerate(TABLES[:4])}),
    "swap_keep": ({n: table_wise(i % 2) for i, (n, _) in enumerate(TABLES)},
                  {"u0": table_wise(1), "u1": table_wise(0)}),
    "cw_swap": ({n: column_wise([0, 1]) for n, _ in TABLES}, {"u0": column_wise([1, 0]), "u2": column_wise([1, 0])}),
    "out_of_order": ({"u0": table_wise(0), "u1": table_wise(0), "u2": table_wise(1), "u3": table_wise(1),
                      "v0": table_wise(1), "v1": table_wise(0), "v2": table_wise(1), "v3": table_wise(0)},
                     {"v0": table_wise(0), "v1": table_wise(1), "v2": table_wise(0), "v3": table_wise(1)}),
    # a layout change: every u table goes row-wise, so each rank holds as many u rows as before
    "tw_to_rw": ({**{n: table_wise(i % 2) for i, (n, _) in enumerate(TABLES[:4])},
                  **{n: column_wise([0, 1]) for n, _ in TABLES[4:]}},
                 {n: row_wise() for n, _ in TABLES[:4]}),
}


def move_case(rank, world, name, chunk):
    """Train a step, reshard, then: every weight/state bit kept, forward == a fresh sharding of the
    new plan, and where the new stores live (taken over vs new memory)."""
    mesh = mesh_for(world, 1)
    plan, changes = CASES[name]
    ebc = _ebc()
    mod = shard(ebc, plan, mesh=mesh, optimizer=ADAM)
    mod(_batch(rank)).values().sum().backward()
    before = full_state(mod)
    stats = reshard(mod, changes, chunk_bytes=chunk)
    after = full_state(mod)
    ref = copy.deepcopy(ebc)
    with torch.no_grad():
        for n, _ in TABLES:
            ref.embedding_bags[n].weight.copy_(after[f"embedding_bags.{n}.weight"])
    fresh = shard(ref, {**plan, **changes}, mesh=mesh)
    kjt = _batch(10 + rank)
    return {"same": [k for k in before if not bits_equal(before[k], after[k])],
            "forward": bits_equal(mod(kjt).values(), fresh(kjt).values()),
            "reused": stats.bytes_reused, "allocated": stats.bytes_allocated, "transient": stats.transient_bytes}


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 20])
def test_swaps_take_over_old_buffers_and_keep_every_bit(chunk):
    # each rank's rebuilt group: 20 rows x DIM (table-wise) or 40 rows x DIM/2 (column-wise), weights
    # and Adam's two moments in fp32
    per_rank = {"swap_all": 20 * DIM * 4 * 3, "swap_keep": 20 * DIM * 4 * 3, "cw_swap": 40 * DIM // 2 * 4 * 3}
    for name, total in per_rank.items():
        for r in run_on_ranks(move_case, 2, name, chunk, timeout=120.0):
            assert r["same"] == [] and r["forward"], (name, chunk, r)
            # every new buffer is an old one: nothing allocated, nothing kept was copied
            assert (r["reused"], r["allocated"]) == (total, 0), (name, chunk, r)
            assert r["transient"] <= 2 * 2 * (chunk + ROW_MAX), (name, chunk, r)


def test_swaps_take_over_old_buffers_on_three_ranks():
    # both directions of a swap travel in the same rounds whatever the world size, so its sends are
    # packed and its buffers kept (rounds sending 0 -> 1 before 1 -> 0 would give rank 1 new memory)
    total = 20 * DIM * 4 * 3
    results = run_on_ranks(move_case, 3, "swap_all", 1000, timeout=120.0)
    assert all(r["same"] == [] and r["forward"] for r in results), results
    assert [(r["reused"], r["allocated"]) for r in results] == [(total, 0), (total, 0), (0, 0)], results


def test_a_layout_change_takes_over_a_buffer_of_another_sharding_type():
    # rank 0's table-wise buffer holds u0 and u2 (12 rows); its row-wise one the first 3 rows of every
    # u table (12 rows), u0's and u2's at the rows where they already are
    total = 12 * DIM * 4 * 3
    for r in run_on_ranks(move_case, 2, "tw_to_rw", 64, timeout=120.0):
        assert r["same"] == [] and r["forward"], r
        assert (r["reused"], r["allocated"]) == (total, 0), r


def test_receives_that_outrun_sends_get_new_memory():
    per_rank = 20 * DIM * 4 * 3    # each rank's table-wise group: 20 rows, weights + two moments
    for chunk, fresh in ((64, True), (1 << 20, False)):
        for r in run_on_ranks(move_case, 2, "out_of_order", chunk, timeout=120.0):
            assert r["same"] == [] and r["forward"], (chunk, r)
            # 64-byte messages: row 2 of a buffer is received (round 2) before it is sent (round 6)
            assert r["reused"] + r["allocated"] == per_rank and (r["allocated"] > 0) == fresh, (chunk, r)


def _msg(t: torch.Tensor) -> Message:
    m = Message()
    m.add(Item(0, 1, t.shape[0], t.shape[1] * 4, t, t), 0, t.shape[0])
    return m


def test_order_packs_same_round_sends_and_refuses_later_ones():
    buf = torch.zeros(4, 4)
    # round 0 sends rows 0-1 and receives into rows 0-1: packed first, no conflict
    rounds = [({1: _msg(buf[0:2])}, {1: _msg(buf[0:2])})]
    assert _order(rounds, [])[2] == set() and rounds[0][0][1].pack
    # round 0 receives into rows 2-3, which round 1 still has to send: that memory is refused
    rounds = [({1: _msg(buf[0:2])}, {1: _msg(buf[2:4])}), ({1: _msg(buf[2:4])}, {1: _msg(buf[0:2])})]
    assert _order(rounds, [])[2] == {buf.untyped_storage().data_ptr()}
    # a local copy reading rows a receive writes runs before round 0; one writing rows a send reads is refused
    other, third = torch.zeros(2, 4), torch.zeros(2, 4)
    early, late, bad = _order([({1: _msg(buf[0:2])}, {1: _msg(buf[2:4])})], [(buf[2:4], other), (third, buf[0:2])])
    assert [e[0].data_ptr() for e in early] == [buf[2:4].data_ptr()] and bad == {buf.untyped_storage().data_ptr()}
