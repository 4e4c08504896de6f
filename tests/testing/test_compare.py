"""Comparison helpers: they pass on equal values and fail naming what, where and which rank."""

import math
import re

import pytest
import torch

from shardwise.testing import run_on_ranks
from shardwise.testing.compare import (
    assert_close,
    assert_ranks_agree,
    assert_same,
    assert_same_on_all_ranks,
    assert_shards_match,
)


def test_assert_same_accepts_equal_nested_values():
    value = {"plan": [(0, "a"), (1, "b")], "t": torch.tensor([1.0, math.nan]), "x": math.nan}
    assert_same(value, {"plan": [(0, "a"), (1, "b")], "t": torch.tensor([1.0, math.nan]),
                        "x": math.nan})


@pytest.mark.parametrize(
    "actual, expected, match",
    [
        (torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]),
         r"plan: 1 of 3 elements differ; first at index \(1,\): 2 != 5"),
        (torch.zeros(2), torch.zeros(2, dtype=torch.float64), r"shape/dtype"),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1},
         r"keys \['a', 'b'\] != \['b', 'a'\] \(order matters\)"),
        ([1, [2, 3]], [1, [2, 4]], r"plan\[1\]\[1\]: 3 != 4"),
        ([1, 2], [1, 2, 3], r"plan: length 2 != 3"),
        ((1,), [1], r"plan: type tuple != list"),
        (torch.zeros(1), 0.0, r"plan: Tensor != float"),
    ],
)
def test_assert_same_reports_the_first_difference(actual, expected, match):
    with pytest.raises(AssertionError, match=match):
        assert_same(actual, expected, what="plan")


def test_assert_close_names_what_and_tolerates_rounding():
    assert_close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]), what="out")
    with pytest.raises(AssertionError, match="^forward output: "):
        assert_close(torch.tensor([1.0]), torch.tensor([1.1]), what="forward output")


def test_assert_ranks_agree_names_the_rank():
    assert_ranks_agree([[1, 2], [1, 2], [1, 2]])
    with pytest.raises(AssertionError, match=r"order on rank 2 vs rank 0\[0\]: 2 != 1"):
        assert_ranks_agree([[1, 2], [1, 2], [2, 1]], what="order")
    with pytest.raises(ValueError, match="results is empty"):
        assert_ranks_agree([])


def test_assert_shards_match_uses_chunk_semantics():
    full = torch.arange(5.0)
    assert_shards_match([full[:2], full[2:4], full[4:], full[5:]], full, dim=0)
    with pytest.raises(AssertionError, match="out on rank 1"):
        assert_shards_match([full[:2], full[2:5], full[5:], full[5:]], full, dim=0, what="out")


WORDS = [f"table_{i}" for i in range(24)]


def set_order_check(rank, world_size, ordered):
    # Iteration order of a set of strings follows hash(): it differs between ranks here.
    order = sorted(set(WORDS)) if ordered else list(set(WORDS))
    try:
        assert_same_on_all_ranks(order, None, what="table order")
    except AssertionError as exc:
        # reported, not raised: a rank that raises costs the harness its worker pool (a fresh one, with
        # torch imported again, for the next test)
        return {"error": str(exc)}
    return {"order": order}


def test_assert_same_on_all_ranks_catches_hash_dependent_order():
    assert run_on_ranks(set_order_check, 2, True) == [{"order": sorted(WORDS)}] * 2
    # Every rank sees the same gathered values, so all raise the same error: no hang, no divergence.
    errors = [r.get("error") for r in run_on_ranks(set_order_check, 2, False)]
    assert errors[0] is not None and errors[1] == errors[0], errors
    assert re.search(r"table order on rank 1 vs rank 0\[0\]", errors[0]), errors[0]
