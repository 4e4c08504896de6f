"""Sharded training with the default update's compiled one-pass kernel against the dense torch
optimizer on the unsharded module (plain PyTorch): every sharding type, duplicate ids, empty bags,
absent features, weighted bags, different batch sizes per rank, gradient division, three steps."""

from shardwise.testing import run_on_ranks

from .. import common
from . import update_workers

PLANS = ["table_wise", "row_wise", "column_wise", "data_parallel"]


def test_compiled_default_update_matches_dense_optimizer():
    cases = [(common.ADAGRAD, True)]
    results = run_on_ranks(update_workers.train_with_compiled_default, 2, PLANS, cases, timeout=300.0)
    for rank, (errors, compiled) in enumerate(results):
        assert compiled == ["Adagrad"], f"rank {rank}: compiled kernels {compiled}"
        assert len(errors) == len(PLANS) * len(cases)
        for key, (err, moved) in errors.items():
            assert moved > 1e-3, f"reference did not train for {key}"
            assert err < 1e-5, f"rank {rank} {key}: max weight error {err}"
