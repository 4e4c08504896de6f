"""EmbeddingCollection(need_indices=True): each feature's output JaggedTensor carries the feature's ids
as its weights (TorchRec's behaviour), unsharded and sharded every way, against the input KJT and
plain F.embedding rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardwise.embedding import EmbeddingCollection, EmbeddingConfig, shard
from shardwise.sparse import JaggedTensor, KeyedJaggedTensor
from shardwise.testing import run_on_ranks, worker_mesh

_TABLES = [("t_a", 11, ["fa", "fb"]), ("t_b", 5, ["fc"])]


def _ec(need_indices: bool) -> EmbeddingCollection:
    cfgs = [EmbeddingConfig(rows, 4, name, feature_names=fs) for name, rows, fs in _TABLES]
    return EmbeddingCollection(cfgs, need_indices=need_indices, init_seed=2)


def _batch(seed: int, keys=("fc", "fa")) -> KeyedJaggedTensor:
    # "fb" absent: its output has no ids; keys out of config order
    g = torch.Generator().manual_seed(seed)
    rows = {f: r for _, r, fs in _TABLES for f in fs}
    lengths = torch.randint(0, 4, (3 * len(keys),), generator=g)
    values = torch.cat([torch.randint(0, rows[k], (int(n),), generator=g)
                        for i, k in enumerate(keys) for n in lengths[3 * i:3 * i + 3]])
    return KeyedJaggedTensor(list(keys), values, lengths=lengths)


def _check(out: dict, kjt: KeyedJaggedTensor, tables: dict) -> None:
    assert list(out) == ["fa", "fb", "fc"]
    for f, jt in out.items():
        assert isinstance(jt, JaggedTensor)
        ids = kjt[f].values() if f in kjt.keys() else torch.zeros(0, dtype=torch.int64)
        assert torch.equal(jt.weights(), ids), (f, jt.weights(), ids)
        assert torch.equal(jt.values(), F.embedding(ids, tables[f])), f


def test_unsharded_outputs_carry_the_ids_as_weights():
    ec, plain = _ec(True), _ec(False)
    kjt = _batch(0)
    tables = {f: ec.embeddings[n].weight.detach() for n, _, fs in _TABLES for f in fs}
    out = ec(kjt)
    _check(out, kjt, tables)
    ref = plain(kjt)
    for f in out:  # everything else as without need_indices
        assert plain(kjt)[f].weights_or_none() is None
        assert torch.equal(out[f].values(), ref[f].values()) and torch.equal(out[f].lengths(), ref[f].lengths())
    assert ec.need_indices() and not plain.need_indices()


def sharded_calls(rank, world):
    from shardwise.embedding import column_wise, data_parallel, row_wise, table_wise

    mesh = worker_mesh((world,))
    ec = _ec(True)
    tables = {f: ec.embeddings[n].weight.detach() for n, _, fs in _TABLES for f in fs}
    plans = {"row": {"t_a": row_wise(), "t_b": row_wise()}, "table": {"t_a": table_wise(0), "t_b": table_wise(1)},
             "column": {"t_a": column_wise([0, 1]), "t_b": data_parallel()}}
    checked = []
    for name, plan in plans.items():
        sharded = shard(ec, plan, mesh=mesh)
        kjt = _batch(10 + rank, keys=("fc", "fa") if rank % 2 else ("fa", "fb", "fc"))
        _check(sharded(kjt), kjt, tables)
        checked.append((name, sharded.need_indices()))
    return checked


def test_sharded_outputs_carry_the_ids_as_weights():
    for checked in run_on_ranks(sharded_calls, 2):
        assert checked == [("row", True), ("table", True), ("column", True)], checked
