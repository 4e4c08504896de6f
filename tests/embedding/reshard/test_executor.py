"""The reshard executor: how moves are cut into bounded messages, and that chains of moves in tiny
messages keep every weight and state bit for bit with bounded transient memory."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from shardwise.embedding import reshard, shard, table_wise
from shardwise.embedding.reshard.executor import Item, cut_messages
from shardwise.testing import run_on_ranks

from .. import common
from ..workers import mesh_for
from .test_reshard import ADAM, NAMES, _sharding, bits_equal, fresh_like, full_state, train

ROW_MAX = 4 * max(d for _, _, d, *_ in common.TABLES)   # bytes of the widest row


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([2, 4, 8, 12, 64])), min_size=1, max_size=6),
       chunk=st.integers(8, 300))
def test_messages_cover_every_row_once_within_the_chunk(rows, chunk):
    items = [Item(0, 1, n, rb, None, None) for n, rb in rows]
    msgs = cut_messages(items, chunk)
    covered = {id(it): [] for it in items}
    for m in msgs:
        assert m.segments
        # a message only exceeds the chunk when it is a single row larger than the chunk
        assert m.nbytes <= chunk or (len(m.segments) == 1 and m.segments[0].rows[1] - m.segments[0].rows[0] == 1)
        end = 0
        for s in m.segments:
            assert s.offset >= end and s.offset % 8 == 0   # aligned for any dtype's view
            end = s.offset + s.nbytes
            covered[id(s.item)].append(s.rows)
        assert m.nbytes == end
    for it in items:
        spans = sorted(covered[id(it)])
        assert [r for span in spans for r in range(*span)] == list(range(it.rows))


def test_messages_are_cut_alike_from_either_side():
    # the sending side holds views, the receiving side only shapes: the cut must not depend on it
    a, b = torch.zeros(10, 6), torch.zeros(10, 6)
    send = cut_messages([Item(0, 1, 10, 24, a, None), Item(0, 1, 3, 4, a[:3, 0], None)], 100)
    recv = cut_messages([Item(0, 1, 10, 24, None, b), Item(0, 1, 3, 4, None, b[:3, 0])], 100)
    assert [[(s.rows, s.offset) for s in m.segments] for m in send] == \
        [[(s.rows, s.offset) for s in m.segments] for m in recv]


def reshard_chain(rank, world, chain, chunk):
    """Each move in messages of ``chunk`` bytes: after each one every weight and state tensor is bit for
    bit what it was; training and a forward afterwards match a fresh sharding. Also returns each move's
    transient buffer peak and the bytes it received."""
    mesh = mesh_for(world, 1)
    ebc = common.make_ebc(seed=11)
    plan = dict(chain[0])
    mod = shard(ebc, plan, mesh=mesh, optimizer=ADAM)
    train(mod, rank, world, 1)
    before, same, memory = full_state(mod), [], []
    for changes in chain[1:]:
        stats = reshard(mod, changes, chunk_bytes=chunk)
        memory.append((stats.transient_bytes, stats.bytes_received[rank]))
        plan.update(changes)
        after = full_state(mod)
        same.append(sorted(k for k in before if not bits_equal(before[k], after[k])))
    train(mod, rank, world, 1, first=1)
    fresh = fresh_like(ebc, full_state(mod), plan, mesh, torch.float32)
    kjt = common.rank_batches(world, 7, False)[rank]
    return same, bits_equal(mod(kjt).values(), fresh(kjt).values()), memory


@st.composite
def chain(draw, world: int):
    dims = {n: d for n, _, d, *_ in common.TABLES}
    out = [{n: _sharding(draw, world, dims[n]) for n in NAMES}]
    for _ in range(draw(st.integers(2, 4))):
        moved = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True))
        out.append({n: _sharding(draw, world, dims[n]) for n in moved})
    return out


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_chains_of_moves_in_tiny_messages(data):
    world = data.draw(st.sampled_from([2, 3]))
    steps = data.draw(chain(world))
    chunk = data.draw(st.sampled_from([64, 200, 1000]))
    for same, forward, memory in run_on_ranks(reshard_chain, world, steps, chunk, timeout=300.0):
        assert all(s == [] for s in same), f"state changed by a move: {same} (chain {steps})"
        assert forward, f"forward differs from a fresh sharding after chain {steps}"
        for transient, received in memory:
            # two rounds alive at once, one message per peer and direction each (a message may
            # exceed the chunk only by one row: <= 6 floats here)
            assert transient <= 2 * 2 * (world - 1) * (chunk + ROW_MAX), (transient, chunk)


def big_move(rank, world, chunk):
    """Every table moves, one into column blocks (its slices must be packed): the bytes received are
    many chunks, the buffers stay a few."""
    mesh = mesh_for(world, 1)
    a = {"t_a": common.column_wise([0, 1]), "t_b": table_wise(1), "t_tiny": table_wise(1), "t_c": table_wise(0)}
    b = {"t_a": common.column_wise([1, 0]), "t_b": table_wise(0), "t_tiny": table_wise(0),
         "t_c": common.column_wise([1, 0])}
    mod = shard(common.make_ebc(seed=12), a, mesh=mesh, optimizer=ADAM)
    train(mod, rank, world, 1)
    before = full_state(mod)
    stats = reshard(mod, b, chunk_bytes=chunk)
    after = full_state(mod)
    return stats.transient_bytes, stats.bytes_received[rank], all(bits_equal(before[k], after[k]) for k in before)


def test_transient_memory_is_bounded_by_chunks_not_by_the_move():
    chunk = 64
    results = run_on_ranks(big_move, 2, chunk, timeout=120.0)
    for transient, received, same in results:
        assert same
        assert received > 8 * chunk, received                # the move is many chunks ...
        assert transient <= 2 * 2 * (chunk + ROW_MAX)        # ... its buffers a bounded few
    assert max(t for t, _, _ in results) > 0                 # the packed column slices were counted


def fan_out(rank, world, chunk):
    """Rank 0 sends column slices to both other ranks and receives column slices from both (every
    message packed on rank 0), there and back."""
    mesh = mesh_for(world, 1)
    a = {"t_a": common.column_wise([1, 2]), "t_b": table_wise(0), "t_tiny": table_wise(0),
         "t_c": common.column_wise([2, 1])}
    b = {"t_a": table_wise(0), "t_b": common.column_wise([1, 2]), "t_tiny": table_wise(1), "t_c": table_wise(0)}
    mod = shard(common.make_ebc(seed=14), a, mesh=mesh, optimizer=ADAM)
    train(mod, rank, world, 1)
    before, out = full_state(mod), []
    for changes in (b, a):
        stats = reshard(mod, changes, chunk_bytes=chunk)
        out.append((stats.transient_bytes, stats.bytes_sent[rank], stats.bytes_received[rank]))
    after = full_state(mod)
    return out, all(bits_equal(before[k], after[k]) for k in before)


def test_round_buffers_do_not_grow_with_the_number_of_peers():
    # rounds go by pairings: a rank exchanges with one peer per round, so it holds
    # at most two rounds x two directions of buffers however many peers it exchanges with
    # (every row here is narrower than the chunk, so no message exceeds it; the previous executor,
    # one round buffer per peer, held 344 bytes here)
    chunk = 64
    assert ROW_MAX < chunk
    results = run_on_ranks(fan_out, 3, chunk, timeout=120.0)
    for moves, same in results:
        assert same
        for transient, _, _ in moves:
            assert transient <= 2 * 2 * chunk, moves
    # rank 0 both sends and receives many packed chunks each way
    assert all(sent > 4 * chunk and received > 4 * chunk and transient > 0
               for transient, sent, received in results[0][0]), results[0][0]


def bad_chunk(rank, world):
    mesh = mesh_for(world, 1)
    mod = shard(common.make_ebc(seed=12), {n: table_wise(0) for n in NAMES}, mesh=mesh, optimizer=ADAM)
    before = full_state(mod)
    errors = []
    for chunk in (0, "big", 1000 + rank):      # invalid everywhere; valid but different per rank
        try:
            reshard(mod, {"t_a": table_wise(1)}, chunk_bytes=chunk)
        except ValueError as exc:
            errors.append(str(exc))
    after = full_state(mod)
    return errors, all(bits_equal(before[k], after[k]) for k in before), mod.sharding_plan()["t_a"]


def test_bad_or_differing_chunk_sizes_raise_everywhere_before_anything_moves():
    for errors, same, ps in run_on_ranks(bad_chunk, 2, timeout=120.0):
        assert len(errors) == 3 and same and ps == table_wise(0)
        assert "chunk_bytes=0 must be an int >= 64" in errors[0]
        assert "chunk_bytes='big'" in errors[1]
        assert "differ across ranks" in errors[2]


if __name__ == "__main__":   # pragma: no cover
    pytest.main([__file__, "-q"])
