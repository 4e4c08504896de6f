"""LookupCounter: per-table id counts in row buckets, against the counts written out per id; the
int32 arithmetic of checked batches gives the same integers as the int64 one."""

from __future__ import annotations

import pytest
import torch

from shardwise.embedding import EmbeddingBagConfig
from shardwise.embedding.reshard.load import LookupCounter
from shardwise.sparse import KeyedJaggedTensor


def _by_hand(tables, kjt, buckets):
    """{table: [ids in bucket b]}: bucket of id i of a table of r rows and n buckets is i * n // r."""
    out = {t.name: [0] * min(buckets, t.num_embeddings) for t in tables}
    table_of = {f: t for t in tables for f in t.feature_names}
    for k in kjt.keys():
        t = table_of[k]
        n = len(out[t.name])
        for i in kjt[k].values().tolist():
            if 0 <= i < t.num_embeddings:
                out[t.name][i * n // t.num_embeddings] += 1
    return out


@pytest.mark.parametrize("sizes", [[1000, 1000, 1000], [7, 1000, 3], [2 ** 26, 40, 2 ** 26 + 3]])
def test_counts_match_the_buckets_written_out(sizes):
    # the last case: rows x buckets >= 2**31, so checked batches count in int64 too
    tables = [EmbeddingBagConfig(r, 4, f"t{i}", feature_names=[f"f{i}"]) for i, r in enumerate(sizes)]
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 50, (6,), generator=g)
    per_key = lengths.view(3, 2).sum(1).tolist()
    values = torch.cat([torch.cat([torch.tensor([r - 1]), torch.randint(0, r, (n - 1,), generator=g)])
                        for r, n in zip(sizes, per_key)])   # each table's last row, then random rows
    kjt = KeyedJaggedTensor(["f0", "f1", "f2"], values, lengths=lengths)
    want = _by_hand(tables, kjt, 64)
    for checked in (False, True):
        counter = LookupCounter(tables, "cpu", buckets=64)
        counter.observe(kjt, checked=checked)
        assert {t.name: h.tolist() for t, h in zip(tables, counter.hist)} == want


def test_unchecked_ids_outside_their_table_are_dropped():
    tables = [EmbeddingBagConfig(10, 4, "t0", feature_names=["f0"]), EmbeddingBagConfig(10, 4, "t1", feature_names=["f1"])]
    kjt = KeyedJaggedTensor(["f0", "f1"], torch.tensor([3, -1, 10, 2 ** 32 + 3, 9]), lengths=torch.tensor([3, 2]))
    counter = LookupCounter(tables, "cpu", buckets=5)
    counter.observe(kjt)
    assert [h.tolist() for h in counter.hist] == [[0, 1, 0, 0, 0], [0, 0, 0, 0, 1]]
