"""batch_problem: a sharded collection's check of one rank's batch (no processes), against the rule
written out per id."""

from __future__ import annotations

import pytest
import torch

from shardwise.embedding import batch_checks
from shardwise.embedding.batch_checks import batch_problem
from shardwise.sparse import KeyedJaggedTensor


def _no_feature_problem(kjt) -> None:
    pass


def _first_bad(keys, values, lengths, rows):
    """The rule per id: (id, feature) of the first id outside [0, rows of its feature), or None."""
    at = 0
    per_key = lengths.view(len(keys), -1).sum(1).tolist()
    for k, n in zip(keys, per_key):
        for v in values[at:at + n].tolist():
            if not 0 <= v < rows[k]:
                return v, k
        at += n
    return None


@pytest.mark.parametrize("rows", [{"a": 5, "b": 5, "c": 5}, {"a": 5, "b": 9, "c": 3}])   # one bound / per key
@pytest.mark.parametrize("bad", [None, ("b", 9), ("c", -1), ("a", 5)])
@pytest.mark.parametrize("scan", ["numba", "tensor ops"])   # CPU ids take the numba loop, others tensor ops
def test_id_range_check_matches_the_rule_per_id(rows, bad, scan, monkeypatch):
    if scan == "tensor ops":
        monkeypatch.setattr(batch_checks, "_range_scan", lambda: None)
    else:
        assert batch_checks._range_scan() is not None
    keys = ["a", "b", "c"]
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([2, 1, 0, 3, 2, 1])
    per_key = lengths.view(3, 2).sum(1).tolist()
    values = torch.cat([torch.randint(0, rows[k], (n,), generator=g) for k, n in zip(keys, per_key)])
    if bad is not None:
        k, v = bad
        values[sum(per_key[:keys.index(k)]) + 1] = v
    kjt = KeyedJaggedTensor(keys, values, lengths=lengths)
    got = batch_problem(kjt, _no_feature_problem, rows)
    want = _first_bad(keys, values, lengths, rows)
    if want is None:
        assert got is None
    else:
        v, k = want
        assert got == (f"ValueError: id {v} of feature {k!r} is outside its table's rows [0, {rows[k]}); fix the id "
                       f"or enlarge num_embeddings")
    assert batch_problem(kjt, _no_feature_problem, rows, ids=False) is None   # the id check left out
