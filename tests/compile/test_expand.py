"""DTensorExpandMode: shardings propagated by the DTensor core's rules, vs one process."""
from __future__ import annotations

import warnings

import pytest

from shardwise.testing.harness import run_on_ranks
from tests.compile import dp_cases


@pytest.mark.parametrize("opt,shard_params", [("sgd", False), ("adamw", True)])
def test_block_matches_single_process(opt, shard_params):
    for r in run_on_ranks(dp_cases.expand_vs_single, 2, "block", opt, shard_params):
        assert all(loss < 1e-5 and d < 1e-5 for loss, d in r["diffs"]), r["diffs"]
        # batch-sharded activations make replicated-parameter gradients Partial: all-reduced
        assert r["collectives"].get("all_reduce", (0, 0))[0] > 0
        assert r["kinds"]["param"] == 13 and r["kinds"]["input"] == 2 and r["kinds"]["hparam"] == 1
        if shard_params:
            assert {"(Shard(dim=0),)", "(Replicate(),)"} == set(r["placements"])
            assert r["collectives"].get("all_gather", (0, 0))[0] > 0


def test_mlp_with_replicate_fallback_for_ops_without_rules():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_on_ranks(dp_cases.expand_vs_single, 2, "mlp", "adam", False, 3, True)
    for r in res:
        assert all(loss < 1e-5 and d < 1e-5 for loss, d in r["diffs"]), r["diffs"]


def test_gradient_bucketing_applies_to_expanded_graphs():
    per_param, bucketed = (run_on_ranks(dp_cases.expand_vs_single, 2, "block", "adam", False, 2, False, cap)[0]
                           for cap in (0, 4 << 20))
    for r in (per_param, bucketed):
        assert all(loss < 1e-5 and d < 1e-5 for loss, d in r["diffs"]), r["diffs"]
    assert bucketed["collectives"]["all_reduce"][0] < per_param["collectives"]["all_reduce"][0]
