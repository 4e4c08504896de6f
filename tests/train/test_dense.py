"""Both dense data-parallel modes against one plain PyTorch process training on the whole batch."""

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh
from shardwise.train.model import DLRMDense

STEPS, B, LR = 3, 6, 0.01


def _batches(world):
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        per_rank = []
        for _ in range(world):
            per_rank.append((torch.randn(B, 13, generator=g), torch.randn(B, 4 * 8, generator=g),
                             (torch.rand(B, generator=g) > 0.5).float()))
        out.append(per_rank)
    return out


def _arch():
    torch.manual_seed(3)
    return DLRMDense(num_sparse=4, dim=8, bottom=(16,), top=(16,))


def _run_mode(rank, world, kind, method):
    from shardwise.train.dense import make_dense_runner

    runner = make_dense_runner(kind, _arch(), LR, worker_mesh(world))
    losses, grads = [], []
    for dense, pooled, labels in (b[rank] for b in _batches(world)):
        if method == "step":
            loss, _, g = runner.step(dense, pooled, labels)
        else:   # the whole step: the gradient reaches the embeddings' side through pooled's history
            leaf = pooled.clone().requires_grad_(True)
            loss, _ = runner.train(dense, leaf * 1.0, labels)
            g = leaf.grad
        losses.append(loss.item())
        grads.append(g.clone())
    return losses, grads, runner.state()["params"]


def _reference(world):
    """One process: the mean of the ranks' losses (DDP's averaged gradient), Adam on the whole model."""
    arch = _arch()
    opt = torch.optim.Adam(arch.parameters(), lr=LR)
    losses, grads = [], []
    for per_rank in _batches(world):
        leaves = [p.clone().requires_grad_(True) for _, p, _ in per_rank]
        local = [F.binary_cross_entropy_with_logits(arch(d, leaf), y) for (d, _, y), leaf in zip(per_rank, leaves)]
        torch.stack(local).mean().backward()
        opt.step()
        opt.zero_grad()
        losses.append([x.item() for x in local])
        # the sparse side gets d(its own rank's loss)/d(pooled): world x the gradient of the mean
        grads.append([leaf.grad * world for leaf in leaves])
    return losses, grads, {n: p.detach() for n, p in arch.named_parameters()}


@pytest.mark.parametrize("kind,method", [("ddp", "step"), ("compile", "step"), ("ddp", "train"), ("compile", "train")])
def test_dense_modes_match_one_process(kind, method):
    world = 2
    results = run_on_ranks(_run_mode, world, kind, method, timeout=180)
    losses, grads, params = _reference(world)
    for rank, (r_losses, r_grads, r_params) in enumerate(results):
        assert r_losses == pytest.approx([step[rank] for step in losses], abs=1e-6)
        for got, want in zip(r_grads, grads):
            torch.testing.assert_close(got, want[rank], atol=1e-6, rtol=1e-5)
        for n, want in params.items():
            torch.testing.assert_close(r_params[n], want, atol=1e-6, rtol=1e-5)


def test_default_dense_mode_is_ddp():
    """The job's default dense mode is the faster one measured in this job (benchmarks/dlrm.py):
    eager DDP, until compile-mode replicate is at least as fast (docs/train.md, "Dense modes")."""
    import argparse

    from shardwise.train.config import TrainConfig
    from shardwise.train.worker import add_train_arguments, config_from_args

    assert TrainConfig().dense_parallel == "ddp"
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert config_from_args(parser.parse_args([])).dense_parallel == "ddp"
    assert config_from_args(parser.parse_args(["--dense-parallel", "compile"])).dense_parallel == "compile"


def _update_kernels(rank, world, compile_update):
    import tempfile

    from shardwise.train.config import TrainConfig
    from shardwise.train.loop import Trainer

    with tempfile.TemporaryDirectory(prefix="compile-update-") as out:
        cfg = TrainConfig(steps=2, batch_size=8, rows=100, dim=4, checkpoint_every=0, reshard_at=0, quiet=True,
                          compile_update=compile_update, out=out)
        tr = Trainer(cfg, worker_mesh((world,)))
        # the kernel is compiled lazily at the first backward: its presence is the wiring, not a compile
        return [g.store.kernel is not None for g in tr.sparse._groups if g.store.rule is not None]


def test_compile_update_flag_reaches_the_sharded_collection():
    """--compile-update (off by default: docs/train.md, "The compiled update") builds the job's
    collection with the torch.compile'd fused update (its math is tested against the dense
    reference in tests/embedding); a non-bool setting is refused."""
    import argparse

    from shardwise.train.config import TrainConfig
    from shardwise.train.worker import add_train_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert config_from_args(parser.parse_args([])).compile_update is False
    assert config_from_args(parser.parse_args(["--compile-update"])).compile_update is True
    with pytest.raises(ValueError, match="compile_update='yes' must be True or False"):
        TrainConfig(compile_update="yes")
    for flag in (False, True):
        kernels = run_on_ranks(_update_kernels, 2, flag, timeout=180)
        assert all(k and all(x == flag for x in k) for k in kernels), (flag, kernels)
