"""Compiled DataParallel vs single-process training and eager DDP (real gloo ranks)."""
from __future__ import annotations

import itertools
import math

import pytest

from shardwise.testing.harness import run_on_ranks
from tests.compile import dp_cases

MODELS, STYLES, OPTS = ("mlp", "block"), ("replicate", "fully_shard", "default"), ("sgd", "adam", "adamw")
# world 3 (uneven shards: rows do not divide by 3) runs a Latin square: every model, style and
# optimizer appears, each style with every optimizer across the two models
LATIN = [(m, s, OPTS[(i + j) % 3]) for i, m in enumerate(MODELS) for j, s in enumerate(STYLES)]
# world 2 runs the other 12 of the 18 (model, style, optimizer) combinations, so each one trains against
# one process and DDP on 2 or 3 ranks (every combination is a trace of its own, most of this test's time);
# these 12 still hold every pair: each style with every optimizer, each model with every style and
# every optimizer
COMBOS = [c for c in itertools.product(MODELS, STYLES, OPTS) if c not in LATIN]
ONE_PER_STYLE = [("mlp", "replicate", "adam"), ("block", "fully_shard", "sgd"), ("mlp", "default", "adamw")]
# fused=False: the per-parameter update (gradients averaged by a division) instead of the fused kernel
UNFUSED = [("mlp", "replicate", "adam_unfused"), ("block", "fully_shard", "sgd_unfused")]
ATOL = 1e-5


@pytest.mark.gpu  # on CUDA/NCCL under `make test-gpu` (one GPU per rank, else skipped)
@pytest.mark.parametrize("world, input, combos", [
    (2, "local", COMBOS),          # each rank passes its own batch; mesh = the default group
    (3, "local", LATIN),
    (2, "global", ONE_PER_STYLE),  # every rank passes the whole batch and trains on its slice
    (2, "local", UNFUSED),
])
def test_matches_single_process_and_ddp(world, input, combos):
    # shard_threshold=200 makes "default" mix sharded and replicated parameters in both models
    results = run_on_ranks(dp_cases.train_matrix, world, combos, input=input, shard_threshold=200, timeout=600)
    for rank_results in results:
        for rec in rank_results:
            combo = rec["combo"]
            assert rec["mesh_is_world"], combo
            assert len(rec["single"]) == 2 and len(rec["loss"]) == 5
            for what in ("single", "ddp", "loss"):  # after step 1 and step 5
                assert rec[what][0] < ATOL and rec[what][-1] < ATOL, (combo, what, rec[what])
            sgd_first_step = combo[2].startswith("sgd")  # SGD's momentum buffer appears after step 1: one re-trace
            assert rec["traces"] == (2 if sgd_first_step else 1), (combo, rec["traces"])
            assert rec["graph"]["waits_before_first_use"], combo
            assert rec["graph"]["fwd_gather_dead_before_bwd"], combo
            _check_layout(rec, world)


def _check_layout(rec, world):
    model_name, style, opt_name = rec["combo"]
    n, coll = rec["numels"], rec["collectives"]
    placements = set(n["placements"])
    if style == "replicate":
        assert n["params"] == n["total"] and "all_gather" not in coll and "reduce_scatter" not in coll
        assert placements == {"(Replicate(),)"}
    elif style == "fully_shard":
        # each rank holds ceil(rows/N) rows of every parameter: ceil(P/N) elements plus padding
        assert n["params"] == n["expected"]
        one_row_each = sum(math.prod(shape[1:]) for shape, _ in n["rows"].values())
        assert -(-n["total"] // world) <= n["params"] <= -(-n["total"] // world) + one_row_each
        assert "all_reduce" not in coll and rec["graph"]["bwd_gathers"] > 0
        assert placements == {"(Shard(dim=0),)"}
        for fqn, states in n["state"].items():
            for k, shape in states.items():
                if k != "step":
                    assert shape == n["rows"][fqn][0], (fqn, k, shape)
    else:
        sharded = [s for s, sh in n["rows"].values() if sh]
        assert sharded and len(sharded) < len(n["rows"]), n["rows"]
        assert {"all_reduce", "all_gather", "reduce_scatter"} <= set(coll)
    assert n["opt_state_types"] and set(n["opt_state_types"]) <= {"DTensor", "Tensor"}
    assert "DTensor" in n["opt_state_types"]


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_bucketing_reduces_collectives(style):
    res = run_on_ranks(dp_cases.bucketing_pair, 2, "block", style, "adam")
    for r in res:
        unbucketed, bucketed = r[0], r[1 << 20]
        assert sum(c for c, _ in bucketed.values()) < sum(c for c, _ in unbucketed.values())
        # same bytes move either way: bucketing only merges collectives
        assert {k: b for k, (_, b) in bucketed.items()} == {k: b for k, (_, b) in unbucketed.items()}
        assert r["max_diff"] < 1e-6
    # every bucketing/scheduling decision depends on sizes only: all ranks build the same program
    assert res[0]["code_0"] == res[1]["code_0"] and res[0][f"code_{1 << 20}"] == res[1][f"code_{1 << 20}"]


def test_mesh_defaults_lazily_and_needs_a_process_group():
    from shardwise.compile import DataParallel, DTensorExpandMode
    from shardwise.tensor import Shard

    for mode in (DataParallel("fully_shard"), DataParallel(parallel_style="default"),
                 DTensorExpandMode([[Shard(0)]])):
        # built before init_process_group (e.g. at import time); the mesh is only needed by the first step
        with pytest.raises(RuntimeError, match=r"mesh=None means all ranks of the default process group.*"
                                               r"init_process_group\(\) first"):
            mode.mesh
    assert DataParallel(parallel_style="default").style == "default"
    assert "input='local'" in repr(DataParallel()) and "default group" in repr(DataParallel())


def test_mesh_first_form_still_works():
    results = run_on_ranks(dp_cases.mesh_first_forms, 2)
    assert results[0] == results[1]
    assert results[0] == {
        "dp": ("fully_shard", (0, None), True, "local"), "dp_kw": ("replicate", (None, None, None), True, "local"),
        "expand": (True, 2), "expand_default": (True, 2), "dp_default": (True, 2),
    }
