"""Row-wise embedding behaviour: collectives issued, plan caching with pending outputs, several
lookups in one forward, and errors raised on every rank."""

import torch
import torch.nn.functional as F

from shardwise.tensor import CollectiveCounter, Replicate, Shard, distribute_tensor, propagation_cache
from shardwise.tensor.ops.nn.embedding import EmbeddingIndexError, embedding_index_check
from shardwise.testing import run_on_ranks, worker_mesh


def _table(v, d, seed, mesh):
    full = torch.randn(v, d, generator=torch.Generator().manual_seed(seed))
    return full, distribute_tensor(full, mesh, [Shard(0)]).requires_grad_()


def _rep(t, mesh):
    return distribute_tensor(t, mesh, [Replicate()])


def _counts(rank, world):
    mesh = worker_mesh((world,))
    full, w = _table(11, 4, 0, mesh)
    ids = _rep(torch.tensor([[0, 10, 5], [5, 3, 10]]), mesh)
    grad = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))
    with CollectiveCounter() as fwd:
        out = F.embedding(ids, w)
    with CollectiveCounter() as red:
        y = out.full_tensor()
    with CollectiveCounter() as rs:
        ys = out.redistribute(mesh, [Shard(0)])
    with CollectiveCounter() as bwd:
        y.backward(grad)
    ref = full.clone().requires_grad_()
    F.embedding(ids.full_tensor(), ref).backward(grad)
    torch.testing.assert_close(w.grad.full_tensor(), ref.grad)
    torch.testing.assert_close(ys.full_tensor(), F.embedding(ids.full_tensor(), full))
    return fwd.counts, red.counts, rs.counts, bwd.counts


def test_collectives_rowwise():
    for counts in run_on_ranks(_counts, 2):
        assert counts == ({}, {"all_reduce": 1}, {"reduce_scatter": 1}, {}), counts


def _cache_and_pending(rank, world):
    mesh = worker_mesh((world,))
    full, w = _table(9, 5, 2, mesh)
    gen = torch.Generator().manual_seed(3)
    id_sets = [torch.randint(0, 9, (4, 3), generator=gen) for _ in range(4)]
    F.embedding(_rep(id_sets[0], mesh), w).full_tensor()  # plans built
    cache = propagation_cache()
    hits0, misses0 = cache.hits, cache.misses
    for ids in id_sets:  # identical specs, different id values: cache hits, fresh masks
        torch.testing.assert_close(F.embedding(_rep(ids, mesh), w).full_tensor(), F.embedding(ids, full))
    hits, misses = cache.hits - hits0, cache.misses - misses0
    # pending outputs of equal shapes reduced out of order, and one dropped unreduced
    a, b = (F.embedding(_rep(ids, mesh), w) for ids in id_sets[:2])
    dropped = F.embedding(_rep(id_sets[2], mesh), w)
    torch.testing.assert_close(b.full_tensor(), F.embedding(id_sets[1], full))
    torch.testing.assert_close(a.full_tensor(), F.embedding(id_sets[0], full))
    del dropped
    torch.testing.assert_close(F.embedding(_rep(id_sets[3], mesh), w).full_tensor(), F.embedding(id_sets[3], full))
    return hits, misses


def test_cache_hits_and_pending_outputs():
    for hits, misses in run_on_ranks(_cache_and_pending, 2):
        assert (hits, misses) == (4, 0)  # one plan hit per lookup


def _shared_ids(rank, world):
    """Two row-wise tables looked up with one replicated ids DTensor; one table looked up twice."""
    mesh = worker_mesh((world,))
    f1, w1 = _table(7, 4, 4, mesh)
    f2, w2 = _table(10, 4, 5, mesh)
    ids = torch.tensor([[6, 0, 3], [1, 6, 2]])
    other = torch.tensor([[9, 9, 0], [4, 5, 8]])
    ids_dt, other_dt = _rep(ids, mesh), _rep(other, mesh)
    y = (F.embedding(ids_dt, w1) + F.embedding(ids_dt, w2)) * F.embedding(other_dt, w2)
    y = y + F.embedding(ids_dt, w1) * 0.5
    y.full_tensor().square().sum().backward()
    r1, r2 = f1.clone().requires_grad_(), f2.clone().requires_grad_()
    ref = (F.embedding(ids, r1) + F.embedding(ids, r2)) * F.embedding(other, r2) + F.embedding(ids, r1) * 0.5
    ref.square().sum().backward()
    torch.testing.assert_close(y.full_tensor(), ref.detach())
    torch.testing.assert_close(w1.grad.full_tensor(), r1.grad)
    torch.testing.assert_close(w2.grad.full_tensor(), r2.grad)
    return w1.grad.placements, w2.grad.placements


def test_two_tables_shared_ids_and_one_table_twice():
    for pl in run_on_ranks(_shared_ids, 2):
        assert pl == ((Shard(0),), (Shard(0),))


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares the exception type and text per rank
        return type(e), str(e)
    return None


def _errors(rank, world):
    mesh = worker_mesh((world,))
    full, w = _table(6, 3, 6, mesh)
    before = w.full_tensor().clone()
    bad_hi, bad_lo = _rep(torch.tensor([0, 6, 1]), mesh), _rep(torch.tensor([-1, 2]), mesh)
    # an out-of-range id only in rank 1's shard of batch-sharded ids still raises on every rank
    only_last = torch.tensor([0, 1, 2, 3 if rank == 0 else 7])
    from shardwise.tensor import DTensor
    sharded_ids = DTensor.from_local(only_last[rank * 2:rank * 2 + 2], mesh, [Shard(0)])
    wr = distribute_tensor(full, mesh, [Replicate()])
    res = {
        "hi": _catch(lambda: F.embedding(bad_hi, w)),
        "lo": _catch(lambda: F.embedding(bad_lo, w)),
        "renorm": _catch(lambda: F.embedding(bad_hi, w, max_norm=1.0)),
        "sharded": _catch(lambda: F.embedding(sharded_ids, wr)),
        "sparse": _catch(lambda: F.embedding(_rep(torch.tensor([1]), mesh), w, sparse=True)),
        "colnorm": _catch(lambda: F.embedding(_rep(torch.tensor([1]), mesh),
                                              distribute_tensor(full, mesh, [Shard(1)]), max_norm=1.0)),
    }
    with embedding_index_check(False):  # documented switch: the owner-less id reads a zero row
        unchecked = F.embedding(_rep(torch.tensor([6]), mesh), w).full_tensor()
    assert torch.equal(w.full_tensor(), before), "weights changed by a failed call"
    assert torch.equal(unchecked, torch.zeros(1, 3)), unchecked
    return res


def test_errors_on_every_rank():
    results = run_on_ranks(_errors, 2)
    assert results[0] == results[1]
    res = results[0]
    for key in ("hi", "lo", "renorm", "sharded"):
        etype, msg = res[key]
        assert issubclass(etype, IndexError) and etype is EmbeddingIndexError, (key, etype)
        assert "num_embeddings=6" in msg and "[0, 5]" in msg, msg
    assert "-1" in res["lo"][1] and "id 6" in res["hi"][1] and "id 7" in res["sharded"][1]
    assert res["sparse"][0] is ValueError and "sparse=True" in res["sparse"][1]
    assert res["colnorm"][0] is ValueError and "max_norm" in res["colnorm"][1]
