"""The job's log without a per-step collective: StepLog's losses equal the per-step all-reduced mean
bit for bit and its window AUC equals the AUC of every rank's predictions (world 2 and 3); the
Trainer's logged history holds every step's global mean loss, also across checkpoint flushes; a flush
started in the background (start, other collectives, collect a step later) gives the same numbers."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.distributed as dist

from shardwise.testing import run_on_ranks, worker_mesh
from shardwise.train.model import auc
from shardwise.train.report.steplog import StepLog


def _new_history() -> dict:
    return {"step": [], "loss": [], "auc_step": [], "auc": [], "examples_per_s": []}


def _gathered_auc(s, lab, world):
    every_s = [torch.empty_like(s) for _ in range(world)]
    every_y = [torch.empty_like(lab) for _ in range(world)]
    dist.all_gather(every_s, s)
    dist.all_gather(every_y, lab)
    return auc(torch.cat(every_s), torch.cat(every_y))


def _steplog(rank, world):
    g = torch.Generator().manual_seed(100 + rank)
    history = _new_history()
    log = StepLog(history)
    want_loss, scores, labels, got = [], [], [], []
    for step in range(1, 12):
        loss = torch.rand((), generator=g, dtype=torch.float32) * 3
        logits = torch.randn(5, generator=g)
        y = (torch.rand(5, generator=g) < 0.4).float()
        log.add(step, loss, logits, y)
        t = loss.reshape(1).double()      # ground truth: what the old per-step all-reduce gave
        dist.all_reduce(t)
        want_loss.append(float(t.item()) / world)
        scores.append(torch.sigmoid(logits))
        labels.append(y)
        if step == 3:                      # a checkpoint flush: losses only, the window stays
            assert log.flush(with_auc=False)[1] is None
        if step == 5:                      # in the background: other collectives run before collect()
            log.start(with_auc=True)
            assert log.in_flight and log.pending == 0
            window = (torch.cat(scores), torch.cat(labels))
            scores, labels = [], []
        if step == 6:                      # collected a step later; step 6 belongs to the next flush
            last, a = log.collect()
            assert not log.in_flight and log.pending == 1 and history["step"] == list(range(1, 6))
            got.append((last, a, _gathered_auc(*window, world)))
        if step == 11:
            last, a = log.flush(with_auc=True)
            got.append((last, a, _gathered_auc(torch.cat(scores), torch.cat(labels), world)))
            scores, labels = [], []
    assert log.pending == 0 and log.flush(with_auc=True) == (None, None) and log.collect() == (None, None)
    return history, want_loss, got


@pytest.mark.parametrize("world", [2, 3])
def test_steplog_equals_per_step_reduction(world):
    results = run_on_ranks(_steplog, world, timeout=120)
    for history, want_loss, got in results:
        assert history["step"] == list(range(1, 12))
        assert history["loss"] == want_loss            # bit for bit
        assert history["auc_step"] == [5, 11]
        for last, a, want_auc in got:
            assert a == want_auc
        assert [g[0] for g in got] == [want_loss[4], want_loss[10]]
        assert history["auc"] == [g[2] for g in got]
    assert all(r[0] == results[0][0] for r in results)   # every rank logs the same


def _job(rank, world, out):
    from shardwise.train import loop
    from shardwise.train.config import TrainConfig

    local = []
    real = loop.Trainer._train_batch

    def record(self, batch):
        loss, logits, labels = real(self, batch)
        local.append(float(loss))
        return loss, logits, labels
    loop.Trainer._train_batch = record
    try:
        cfg = TrainConfig(steps=13, batch_size=16, rows=200, dim=4, checkpoint_every=3, reshard_at=0,
                          eval_rows=64, quiet=True, log_every=5, out=out)
        trainer = loop.Trainer(cfg, worker_mesh((world,)))
        trainer.run()
    finally:
        loop.Trainer._train_batch = real
    return trainer.history, local


def test_trainer_logs_every_steps_global_mean_loss():
    out = tempfile.mkdtemp(prefix="steplog-")
    results = run_on_ranks(_job, 2, out, timeout=300)
    (history, local0), (_, local1) = results
    assert history["step"] == list(range(1, 14))
    want = [(torch.tensor(a, dtype=torch.float64) + b).item() / 2 for a, b in zip(local0, local1)]
    assert history["loss"] == pytest.approx(want, rel=0, abs=1e-7)
    assert history["auc_step"] == [5, 10, 13] and len(history["examples_per_s"]) == 3
    other = results[1][0]   # every rank logs the same steps, losses and AUCs (examples/s is its own clock)
    assert all(other[k] == history[k] for k in ("step", "loss", "auc_step", "auc"))
