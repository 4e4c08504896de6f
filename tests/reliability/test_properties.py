"""Property tests (hypothesis) over random shapes, meshes and placements.

* redistribute A -> B -> A gives back the same tensor on real ranks (4 gloo ranks, 1-D and 2-D meshes,
  uneven and empty shards, pending sums);
* every sharding strategy of a few core ops agrees with the op on full tensors, for random shapes
  and meshes (``shardwise.tensor.validate`` on simulated ranks);
* reshard A -> B -> A of a trained sharded collection gives back its weights and optimizer state bit
  for bit, and lookups give the same rows in every layout.
"""

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch.ops import aten

from shardwise.tensor import Partial, Replicate, Shard
from shardwise.tensor.validate import Sample, validate_rules
from shardwise.testing import run_on_ranks, worker_mesh

_MESHES = [(4,), (2, 2)]


def _placement(code, ndim):
    kind, arg = code
    if kind == "S":
        return Shard(arg % ndim)
    return Replicate() if kind == "R" else Partial("sum")


def _round_trip(rank, world, shape, mesh_shape, a_codes, b_codes, seed):
    from shardwise.tensor import distribute_tensor

    mesh = worker_mesh(mesh_shape)
    g = torch.Generator().manual_seed(seed)
    # small integers: sums of partial pieces are exact, so the round trip can be compared bit for bit
    full = torch.randint(-8, 8, shape, generator=g).float()
    a = [_placement(c, len(shape)) for c in a_codes]
    b = [_placement(c, len(shape)) for c in b_codes]
    x = distribute_tensor(full, mesh, a)
    y = x.redistribute(mesh, b)
    back = y.redistribute(mesh, a)
    return {
        "a_full": torch.equal(x.full_tensor(), full),
        "b_full": torch.equal(y.full_tensor(), full),
        "back_full": torch.equal(back.full_tensor(), full),
        # a pending sum may come back split differently; every other layout must give the same pieces
        "back_local": torch.equal(back.to_local(), x.to_local()) or any(p.is_partial() for p in a),
        "placements": tuple(str(p) for p in back.placements) == tuple(str(p) for p in a),
    }


_code = st.one_of(st.tuples(st.just("S"), st.integers(0, 2)), st.tuples(st.sampled_from("RP"), st.just(0)))


@st.composite
def _layouts(draw):
    # zero-size dims included: an empty shard must keep its local shape through every transition
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=1, max_size=3)))
    mesh = draw(st.sampled_from(_MESHES))
    a = draw(st.lists(_code, min_size=len(mesh), max_size=len(mesh)))
    b = draw(st.lists(_code, min_size=len(mesh), max_size=len(mesh)))
    return shape, mesh, a, b


# no shrinking: every example is a round of collectives, and the failure message already names the case
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(_layouts(), st.integers(0, 2**16))
def test_redistribute_there_and_back_is_the_identity(layout, seed):
    shape, mesh, a, b = layout
    results = run_on_ranks(_round_trip, 4, shape, mesh, a, b, seed, timeout=60)
    for rank, r in enumerate(results):
        assert all(r.values()), f"rank {rank}: {shape} on mesh {mesh}, {a} -> {b} -> back: {r}"


_OPS = {
    "add": (aten.add.Tensor, 2),
    "mul": (aten.mul.Tensor, 2),
    "sum": (aten.sum.dim_IntList, 1),
    "mm": (aten.mm.default, None),
    "t": (aten.t.default, None),
}


@st.composite
def _op_samples(draw):
    name = draw(st.sampled_from(sorted(_OPS)))
    op, arity = _OPS[name]
    dims = draw(st.lists(st.integers(0, 6), min_size=2, max_size=2))
    if name == "mm":
        k = draw(st.integers(1, 5))
        args = (torch.randn(dims[0], k), torch.randn(k, dims[1]))
    elif name == "t":
        args = (torch.randn(*dims),)
    elif name == "sum":
        args = (torch.randn(*dims), [draw(st.integers(0, 1))])
    else:
        args = tuple(torch.randn(*dims) for _ in range(arity))
    mesh = draw(st.sampled_from([2, 3, 4, (2, 2)]))
    return op, Sample(args), mesh


@settings(max_examples=25, deadline=None)
@given(_op_samples())
def test_every_strategy_agrees_with_the_full_tensor_op(case):
    op, sample, mesh = case
    report = validate_rules([op], world_sizes=(mesh,), samples={op: [sample]})
    assert report.ok, report.format() if hasattr(report, "format") else report
    assert report.ops[str(op)].checked > 0


def test_round_trip_through_every_layout_pair_of_a_small_tensor():
    # the exhaustive corner next to the random search: an uneven 3x5 tensor, every A and B on 4 ranks
    codes = [("S", 0), ("S", 1), ("R", 0), ("P", 0)]
    for a in codes:
        for b in codes:
            results = run_on_ranks(_round_trip, 4, (3, 5), (4,), [a], [b], 7, timeout=60)
            for rank, r in enumerate(results):
                assert all(r.values()), f"rank {rank}: {a} -> {b} -> back: {r}"


def test_round_trip_with_an_empty_dim():
    results = run_on_ranks(_round_trip, 4, (5, 0), (4,), [("S", 0)], [("S", 1)], 0, timeout=60)
    for rank, r in enumerate(results):
        assert all(r.values()), f"rank {rank}: {r}"


# ---- reshard A -> B -> A ----------------------------------------------------------------------------
def _reshard_round_trip(rank, world, targets, sizes, seed):
    """Shard random-size tables, train a step, move ``targets`` there and back; compare with before."""
    import functools

    from shardwise.embedding import (EmbeddingBagCollection, EmbeddingBagConfig, column_wise, data_parallel,
                                     row_wise, shard, table_wise)
    from shardwise.embedding.reshard import current_plan, reshard
    from shardwise.sparse import KeyedJaggedTensor

    from ._runner import digest

    make = {"tw0": lambda: table_wise(0), "tw_last": lambda: table_wise(world - 1), "rw": row_wise,
            "cw": lambda: column_wise(list(range(world))[::-1]), "dp": data_parallel}
    torch.manual_seed(seed)
    (rows_a, dim_a), (rows_b, dim_b) = sizes
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="ta", num_embeddings=rows_a, embedding_dim=dim_a, feature_names=["fa"]),
                                  EmbeddingBagConfig(name="tb", num_embeddings=rows_b, embedding_dim=dim_b, feature_names=["fb"], pooling="mean")])
    s = shard(ebc, {"ta": row_wise(), "tb": table_wise(world - 1)},
              optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
    g = torch.Generator().manual_seed(seed + rank)   # each rank its own batch, as in training
    lengths = torch.randint(0, 4, (6,), generator=g)
    n_a = int(lengths[:3].sum())
    ids = torch.cat([torch.randint(0, rows_a, (n_a,), generator=g),
                     torch.randint(0, rows_b, (int(lengths.sum()) - n_a,), generator=g)])
    kjt = KeyedJaggedTensor(["fa", "fb"], ids, lengths=lengths)
    s(kjt).values().sum().backward()   # non-zero optimizer state: a lost accumulator would show
    before, out = digest([s, s.fused_optimizer]), s(kjt).values().detach()
    start = current_plan(s)
    reshard(s, {t: make[k]() for t, k in targets.items()})
    moved = s(kjt).values().detach()
    reshard(s, {t: start[t] for t in targets})
    return {"state_back": digest([s, s.fused_optimizer]) == before,
            "same_output_moved": torch.allclose(moved, out, rtol=0, atol=1e-6),
            "same_output_back": torch.equal(s(kjt).values(), out)}


_TARGETS = st.dictionaries(st.sampled_from(["ta", "tb"]), st.sampled_from(["tw0", "tw_last", "rw", "cw", "dp"]),
                           min_size=1)
# rows from 1 (fewer rows than ranks: empty row-wise shards) and dims from 3 (column-wise over 3 ranks)
_SIZES = st.tuples(st.tuples(st.integers(1, 13), st.integers(3, 6)), st.tuples(st.integers(1, 13), st.integers(3, 6)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(_TARGETS, _SIZES, st.sampled_from([2, 3]), st.integers(0, 2**16))
def test_reshard_there_and_back_is_bit_exact(targets, sizes, world, seed):
    # weights and every optimizer state come back bit for bit, and lookups do not change on the way
    # (moved: pooled sums may be added in another order, so to rounding; back: bit for bit)
    for rank, r in enumerate(run_on_ranks(_reshard_round_trip, world, targets, sizes, seed, timeout=60)):
        assert all(r.values()), f"rank {rank} of {world}: {targets}, sizes {sizes}, seed {seed}: {r}"
