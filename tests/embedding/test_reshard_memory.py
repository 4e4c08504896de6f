"""Reshard memory reuse: carving new buffers out of old ones, the hazard test, the receive ring."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from shardwise.embedding import reshard, shard, table_wise
from shardwise.embedding.reshard_memory import NewBuffer, Spans, carve, span
from shardwise.testing import run_on_ranks

from . import common
from .test_reshard import ADAM, NAMES, _sharding, bits_equal, fresh_like, full_state, train
from .workers import mesh_for


def test_carve_keeps_rows_in_place_and_fills_the_gap():
    old = torch.arange(40.0).view(10, 4)           # one old buffer: 10 rows of width 4
    keep = NewBuffer("keep", 4, 4, in_place=[(old[6:10], 0)])   # its rows 6..9 become rows 0..3 here
    other = NewBuffer("other", 12, 2)              # 24 elements: exactly the rest, rows 0..5
    got = carve([keep, other], [old])
    assert set(got) == {"keep", "other"}
    assert got["keep"].data_ptr() == old[6].data_ptr() and torch.equal(got["keep"], old[6:10])
    assert got["other"].data_ptr() == old.data_ptr() and got["other"].shape == (12, 2)


def test_carve_never_leaves_dead_memory():
    old = torch.zeros(10, 4)
    keep = NewBuffer("keep", 4, 4, in_place=[(old[6:10], 0)])
    odd = NewBuffer("odd", 5, 4)                   # 20 elements: a 24-element gap stays -> nothing reused
    assert carve([keep, odd], [old]) == {}


def test_carve_over_adjacent_old_buffers():
    flat = torch.arange(64.0)
    a, b = flat[:32].view(8, 4), flat[32:].view(8, 4)   # two old buffers in one storage, adjacent
    whole = NewBuffer("whole", 16, 4, in_place=[(b[0:8], 8)])
    got = carve([whole], [a, b])
    assert got["whole"].data_ptr() == flat.data_ptr() and torch.equal(got["whole"], flat.view(16, 4))


def test_spans():
    x = torch.zeros(8, 8)
    spans = Spans([span(x[0:2]), span(x[4:5, 2:3])])
    assert spans.meets(span(x[1:3])) and spans.meets(span(x[4:5, 0:8]))
    assert not spans.meets(span(x[2:4])) and not spans.meets(span(x[5:8]))
    assert span(x[3:3]) == (0, 0) and not spans.meets((0, 0))


class _AsIfNotGloo:
    """torch.distributed, except that the group's backend reads as NCCL (the one-batch path)."""

    def __getattr__(self, name):
        return getattr(torch.distributed, name)

    def get_backend(self, group=None):
        return "nccl"


def reshard_chain(rank, world, chain, one_batch=False):
    """Tiny messages, a one-buffer ring and one pack buffer (so receives queue up behind sends and
    the ring has to grow); after each reshard every weight and state tensor is bit for bit what it
    was; training and a forward afterwards match a fresh sharding."""
    from shardwise.embedding import reshard_move, reshard_schedule
    saved = (reshard_move._CHUNK_BYTES, reshard_move._RING_BUFFERS, reshard_move._PATIENCE_S,
             reshard_schedule._PACKS, reshard_move.dist)
    reshard_move._CHUNK_BYTES, reshard_move._RING_BUFFERS, reshard_move._PATIENCE_S = 48, 1, 0.001
    reshard_schedule._PACKS = 1
    if one_batch:
        reshard_move.dist = _AsIfNotGloo()
    try:    # the worker processes are reused by later tests: leave the module as it was
        return _chain(rank, world, chain)
    finally:
        (reshard_move._CHUNK_BYTES, reshard_move._RING_BUFFERS, reshard_move._PATIENCE_S,
         reshard_schedule._PACKS, reshard_move.dist) = saved


def _chain(rank, world, chain):
    mesh = mesh_for(world, 1)
    ebc = common.make_ebc(seed=11)
    plan = dict(chain[0])
    mod = shard(ebc, plan, mesh=mesh, optimizer=ADAM)
    train(mod, rank, world, 1)
    before, same = full_state(mod), []
    for changes in chain[1:]:
        reshard(mod, changes)
        plan.update(changes)
        after = full_state(mod)
        same.append(sorted(k for k in before if not bits_equal(before[k], after[k])))
    train(mod, rank, world, 1, first=1)
    fresh = fresh_like(ebc, full_state(mod), plan, mesh, torch.float32)
    kjt = common.rank_batches(world, 7, False)[rank]
    return same, bits_equal(mod(kjt).values(), fresh(kjt).values())


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
def test_reshard_chains_with_a_tiny_ring(data):
    world = data.draw(st.sampled_from([2, 3]))
    steps = data.draw(chain(world))
    for same, forward in run_on_ranks(reshard_chain, world, steps, timeout=300.0):
        assert all(s == [] for s in same), f"state changed by a move: {same} (chain {steps})"
        assert forward, f"forward differs from a fresh sharding after chain {steps}"


def _local_ptr(mod, table: str, rank: int) -> int:
    g = next(g for g in mod._groups if any(b.table == table for b in g.routing.boxes))
    i = next(i for i, b in enumerate(g.routing.boxes) if b.table == table and b.rank == rank)
    return g.store.box_view(i).data_ptr()


def test_reshard_chain_in_one_batch():
    # the path taken on NCCL: every message in one batch_isend_irecv, temporaries instead of the ring
    world = 2
    steps = [{"t_a": table_wise(0), "t_b": common.row_wise(), "t_tiny": table_wise(1),
              "t_c": common.column_wise([0, 1])},
             {"t_a": table_wise(1), "t_c": common.column_wise([1, 0])},
             {"t_a": common.row_wise(), "t_b": common.column_wise([0, 1]), "t_tiny": table_wise(0)}]
    for same, forward in run_on_ranks(reshard_chain, world, steps, True, timeout=300.0):
        assert all(s == [] for s in same) and forward


def kept_in_place(rank, world):
    """Half the tables swap ranks; the tables that stay keep their memory (no copy at all)."""
    mesh = mesh_for(world, 1)
    a = {"t_a": table_wise(0), "t_b": table_wise(1), "t_tiny": table_wise(1), "t_c": table_wise(0)}
    mod = shard(common.make_ebc(seed=12), a, mesh=mesh, optimizer=ADAM)
    mine = "t_c" if rank == 0 else "t_b"      # stays, alone in its width buffer
    ptr = _local_ptr(mod, mine, rank)
    before = full_state(mod)
    reshard(mod, {"t_a": table_wise(1), "t_tiny": table_wise(0)})
    after = full_state(mod)
    return (_local_ptr(mod, mine, rank) == ptr,
            all(bits_equal(before[k], after[k]) for k in before))


def test_kept_tables_stay_in_place():
    assert run_on_ranks(kept_in_place, 2, timeout=120.0) == [(True, True)] * 2


def reused_buffers(rank, world):
    """Row- to column-wise and back, twice: the ring and pack buffers of the first round trip are the
    ones the second uses (no fresh pages), and release_reshard_buffers frees them."""
    mesh = mesh_for(world, 1)
    rw = {"t_a": common.row_wise(), "t_b": common.row_wise(), "t_tiny": table_wise(1), "t_c": table_wise(0)}
    cw = {"t_a": common.column_wise([0, 1]), "t_b": common.column_wise([1, 0])}
    mod = shard(common.make_ebc(seed=13), rw, mesh=mesh, optimizer=ADAM)
    before = full_state(mod)
    reshard(mod, cw)
    reshard(mod, {n: rw[n] for n in cw})
    first = [(b.data_ptr(), b.numel()) for b in mod._reshard_scratch]
    reshard(mod, cw)
    reshard(mod, {n: rw[n] for n in cw})
    again = [(b.data_ptr(), b.numel()) for b in mod._reshard_scratch]
    same = all(bits_equal(before[k], v) for k, v in full_state(mod).items())
    # (a stall may still add a buffer in the second round; the first round's must all be reused)
    return again[:len(first)] == first and len(first) > 0, mod.release_reshard_buffers() > 0, mod._reshard_scratch == [], same


def test_reshard_buffers_are_reused_and_released():
    assert run_on_ranks(reused_buffers, 2, timeout=120.0) == [(True, True, True, True)] * 2


def test_move_in_place_like_memmove():
    from shardwise.embedding.reshard_schedule import move_in_place as _move_in_place
    for n in (1, 2, 3, 50, 1000):
        layouts = {   # (source, destination) views of one buffer
            "rows to a column block": lambda b: (b[:n * 64].view(n, 64)[:, :32], b[:n * 32].view(n, 32)),
            "column block to rows": lambda b: (b[:n * 32].view(n, 32), b[:n * 64].view(n, 64)[:, 32:]),
            "rows up by more than a row": lambda b: (b[:n * 64].view(n, 64), b[80:80 + n * 64].view(n, 64)),
            "rows down": lambda b: (b[80:80 + n * 64].view(n, 64), b[:n * 64].view(n, 64)),
        }
        for name, views in layouts.items():
            base = torch.arange(n * 64.0 + 128)
            src, dst = views(base)
            want = src.clone()
            assert _move_in_place(src, dst), (n, name)
            assert torch.equal(dst, want), (n, name)
        base = torch.arange(n * 64.0 + 128)
        before = base.clone()   # every row overlaps itself: impossible by rows, nothing written
        assert not _move_in_place(base[:n * 64].view(n, 64), base[16:16 + n * 64].view(n, 64))
        assert torch.equal(base, before)
