"""Sharded EmbeddingCollection vs the unsharded module (plain F.embedding) on real gloo ranks."""

import pytest

from shardwise.testing import run_on_ranks

from . import common, workers

PLANS = ["table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise", "mixed", "mixed2"]


@pytest.mark.parametrize("world", [2, 3])
def test_forward_matches_unsharded(world):
    results = run_on_ranks(workers.forward_all_plans, world, 1, PLANS)
    for rank, errors in enumerate(results):
        assert len(errors) == 2 * len(PLANS)
        bad = {k: v for k, v in errors.items() if v > 1e-6}
        assert not bad, f"rank {rank}: {bad}"


@pytest.mark.parametrize("world", [2, 3])
def test_training_matches_dense_optimizer(world):
    # SGD / Adagrad on every plan; RowWiseAdagrad (one accumulator per row) on every plan but column-wise
    opts = [common.SGD, common.ADAGRAD]
    results = run_on_ranks(workers.train_all_plans, world, 1, PLANS, opts, timeout=300.0)
    no_cw = [p for p in PLANS if p not in ("column_wise", "mixed", "mixed2")]
    rwa = run_on_ranks(workers.train_all_plans, world, 1, no_cw, [common.ROWWISE], timeout=300.0)
    for rank in range(world):
        errors = {**results[rank], **rwa[rank]}
        assert len(errors) == 2 * len(PLANS) + len(no_cw)
        for key, (err, moved) in errors.items():
            assert moved > 1e-3, f"reference did not train for {key}"
            assert err < 1e-5, f"rank {rank} {key}: max weight error {err}"
