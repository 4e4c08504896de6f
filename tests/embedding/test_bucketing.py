"""The input dist's fast paths against the general paths they replace (same ids, same order): the
one-byte-key row-block bucketing against the (unit, sample) sort, the per-slot copy against the gather.

Both paths are run on one InputDist (no processes: route() has no collective); the general paths are
the ones the end-to-end tests checked against plain PyTorch before the fast paths existed, and they
still serve units sent to several slots (column-wise), more than 256 runs of slots, sequence positions
of whole-table units and more than 64 slots.
"""

import types

import pytest
import torch

from shardwise.embedding import EmbeddingBagConfig
from shardwise.embedding.plan.values import row_wise
from shardwise.embedding.sharding.kinds import row_wise as rw
from shardwise.embedding.sharding.routing import GroupSpec, Routing
from shardwise.embedding.sharding.stages import InputDist
from shardwise.sparse import KeyedJaggedTensor

CASES = [   # world, rows per table, ranks per table (None: all)
    (2, [100, 100, 100], None),              # one block size for every table: one division
    (3, [10, 7, 100], None),                 # a block size per table
    (4, [5, 3, 64], [(0, 2), None, (3, 1, 0)]),
    (8, [2, 100, 9], None),                  # empty trailing blocks
]


def _batch(cfgs, batch, weighted, g):
    keys = [f for c in cfgs for f in c.feature_names]
    rows = [c.num_embeddings for c in cfgs for _ in c.feature_names]
    lengths = torch.randint(0, 5, (len(keys) * batch,), generator=g)   # empty bags included
    vals = torch.cat([torch.randint(0, rows[k], (int(lengths[k * batch:(k + 1) * batch].sum()),), generator=g)
                      for k in range(len(keys))])
    weights = torch.rand(vals.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(keys, vals, weights=weights, lengths=lengths)


def _same(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("slot_loop", [True, False])
@pytest.mark.parametrize("world,rows,ranks", CASES)
def test_bucketing_equals_sort_path(world, rows, ranks, slot_loop, monkeypatch):
    """``slot_loop=False``: the shifts added through one tensor per id (the path of more than 64 slots)."""
    from shardwise.embedding.sharding import bucketing

    if not slot_loop:
        monkeypatch.setattr(bucketing, "_SLOT_LOOP", -1)
    g = torch.Generator().manual_seed(world)
    cfgs = [EmbeddingBagConfig(num_embeddings=r, embedding_dim=4, name=f"t{i}", feature_names=[f"f{i}", f"g{i}"])
            for i, r in enumerate(rows)]
    for rank in range(world):
        topo = types.SimpleNamespace(device=torch.device("cpu"), rank=rank, world_size=world)
        boxes = [b for i, c in enumerate(cfgs)
                 for b in rw.SHARDER.layout(c, row_wise(ranks[i]) if ranks else row_wise(), topo)]
        routing = Routing(GroupSpec(cfgs, boxes, {}, 0), world)
        for keep in (False, True):
            for weighted in (False, True):
                ind = InputDist(routing, topo, weighted, keep_positions=keep)
                assert ind.bucketing is not None
                kjt = _batch(cfgs, int(torch.randint(1, 6, (1,), generator=g)), weighted, g)
                fast = ind.route(kjt)
                ind.bucketing = None
                _same(fast, ind.route(kjt))


def test_bucketing_uneven_blocks_equals_sort_path():
    """Row blocks that are not torch.chunk's (as a reshard may leave them), two blocks of one table on one
    rank: the slots to rank 0 split into several runs, each with its own row range per feature."""
    from shardwise.embedding.plan.values import ShardBox

    g = torch.Generator().manual_seed(0)
    cfgs = [EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t0", feature_names=["f0"]),
            EmbeddingBagConfig(num_embeddings=12, embedding_dim=4, name="t1", feature_names=["f1", "g1"])]
    boxes = [ShardBox("t0", 0, 0, 3, 0, 4), ShardBox("t0", 1, 3, 7, 0, 4),
             ShardBox("t1", 1, 0, 6, 0, 4), ShardBox("t1", 0, 6, 1, 0, 4), ShardBox("t1", 0, 7, 5, 0, 4)]
    routing = Routing(GroupSpec(cfgs, boxes, {}, 0), 2)
    for rank in range(2):
        topo = types.SimpleNamespace(device=torch.device("cpu"), rank=rank, world_size=2)
        ind = InputDist(routing, topo, True, keep_positions=True)
        assert ind.bucketing is not None and ind.bucketing.num_runs > 2
        kjt = _batch(cfgs, 4, True, g)
        fast = ind.route(kjt)
        ind.bucketing = None
        _same(fast, ind.route(kjt))


@pytest.mark.parametrize("copy", ["numba", "slices"])   # CPU int64 ids: one numba loop; else a copy per slot
@pytest.mark.parametrize("kind", ["table_wise", "column_wise"])
def test_slot_copy_equals_index_path(kind, copy, monkeypatch):
    """Whole-table units (table- and column-wise): the per-slot copy against the gather path."""
    from shardwise.embedding.plan import values as pv
    from shardwise.embedding.sharding import stages
    from shardwise.embedding.sharding.kinds import column_wise as cw, table_wise as tw

    if copy == "slices":
        monkeypatch.setattr(stages, "_shifted_copy", lambda: None)
    else:
        assert stages._shifted_copy() is not None

    g = torch.Generator().manual_seed(1)
    world = 3
    cfgs = [EmbeddingBagConfig(num_embeddings=20 + i, embedding_dim=6, name=f"t{i}", feature_names=[f"f{i}", f"g{i}"])
            for i in range(4)]
    sharder, ps = (tw, lambda i: pv.table_wise(i % world)) if kind == "table_wise" else \
        (cw, lambda i: pv.column_wise([(i + k) % world for k in range(world)]))
    for rank in range(world):
        topo = types.SimpleNamespace(device=torch.device("cpu"), rank=rank, world_size=world)
        boxes = [b for i, c in enumerate(cfgs) for b in sharder.SHARDER.layout(c, ps(i), topo)]
        for weighted in (False, True):
            ind = InputDist(Routing(GroupSpec(cfgs, boxes, {}, 0), world), topo, weighted)
            kjt = _batch(cfgs, 5, weighted, g)
            fast = ind.route(kjt)
            with monkeypatch.context() as m:
                m.setattr(stages, "_SLOT_LOOP", -1)
                _same(fast, ind.route(kjt))


def _keyed(kjt, keys):
    """``kjt``'s features in the order ``keys`` (features not in ``kjt``: empty bags)."""
    batch, have = kjt.stride(), kjt.keys()
    vals, lens, wts = [], [], []
    for k in keys:
        if k in have:
            i = have.index(k)
            lo, hi = kjt.offset_per_key()[i], kjt.offset_per_key()[i + 1]
            vals.append(kjt.values()[lo:hi])
            lens.append(kjt.lengths()[i * batch:(i + 1) * batch])
            wts.append(kjt.weights()[lo:hi] if kjt.weights_or_none() is not None else None)
        else:
            vals.append(torch.zeros(0, dtype=torch.int64))
            lens.append(torch.zeros(batch, dtype=torch.int64))
            wts.append(torch.zeros(0) if kjt.weights_or_none() is not None else None)
    weights = None if wts[0] is None else torch.cat(wts)
    return KeyedJaggedTensor(keys, torch.cat(vals), weights=weights, lengths=torch.cat(lens))


@pytest.mark.parametrize("weighted", [False, True])
def test_a_batch_holding_the_groups_features_in_a_row_routes_as_any_other_order(weighted):
    """The group's features in its order, alone or between other groups' features, are read as views
    of the batch; any other order (or a missing feature) as a copy per feature: the same ids sent."""
    from shardwise.embedding.plan import values as pv
    from shardwise.embedding.sharding.kinds import table_wise as tw

    g = torch.Generator().manual_seed(2)
    cfgs = [EmbeddingBagConfig(num_embeddings=20 + i, embedding_dim=6, name=f"t{i}", feature_names=[f"f{i}", f"g{i}"])
            for i in range(3)]
    topo = types.SimpleNamespace(device=torch.device("cpu"), rank=0, world_size=2)
    boxes = [b for i, c in enumerate(cfgs) for b in tw.SHARDER.layout(c, pv.table_wise(i % 2), topo)]
    ind = InputDist(Routing(GroupSpec(cfgs, boxes, {}, 0), 2), topo, weighted)
    kjt = _batch(cfgs, 4, weighted, g)
    mine = kjt.keys()
    want = ind.route(_keyed(kjt, mine[::-1]))       # reversed: the copy per feature
    for keys in (mine, ["x"] + mine, mine + ["y", "z"], ["x"] + mine + ["y"]):
        _same(ind.route(_keyed(kjt, keys)), want)
    partial = ind.route(_keyed(kjt, mine[:-1]))      # the last feature absent: empty bags
    _same(partial, ind.route(_keyed(kjt, mine[:-1][::-1])))
