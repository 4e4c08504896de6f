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
    for rank, (by_update, by_store, compiled, store_kernels) in enumerate(results):
        assert compiled == ["Adagrad"], f"rank {rank}: compiled kernels {compiled}"
        assert store_kernels, f"rank {rank}: shard() did not give every large store the compiled kernel"
        for errors in (by_update, by_store):
            assert len(errors) == len(PLANS) * len(cases)
            for key, (err, moved) in errors.items():
                assert moved > 1e-3, f"reference did not train for {key}"
                assert err < 1e-5, f"rank {rank} {key}: max weight error {err}"


def test_small_tables_keep_the_eager_store():
    """Unit-test sizes never compile at shard() time; a GPU store never compiles by this rule."""
    import functools

    import torch

    from shardwise.embedding.optim.row_update import store_compiles
    from shardwise.embedding.optim.rules import resolve_optimizer
    from shardwise.embedding.plan.values import ShardBox

    rule, _ = resolve_optimizer(functools.partial(torch.optim.Adagrad, lr=0.1))
    small = [ShardBox("t", 0, 0, 1000, 0, 64)]
    big = [ShardBox("t", 0, 0, 300_000, 0, 64), ShardBox("u", 1, 0, 300_000, 0, 64)]
    assert not store_compiles(rule, small, 0, "cpu", torch.float32)
    assert not store_compiles(None, big, 0, "cpu", torch.float32)
    assert not store_compiles(rule, big, 0, "cuda", torch.float32)
    assert not store_compiles(rule, big, 2, "cpu", torch.float32)     # no box on rank 2
