"""``shardwise train``'s steady-state examples/s in metrics.json: training steps only -- the start-up
steps, the step after the live reshard and checkpoint steps are left out (and a slow save does not
lower it); the job trains through TrainPipeline."""

from __future__ import annotations

import tempfile
import time

from shardwise.testing import run_on_ranks, worker_mesh

SAVE_SLEEP = 1.0


def _job(rank, world):
    from shardwise.train import checkpoint as ckpt
    from shardwise.train import loop
    from shardwise.train.config import TrainConfig

    cfg = TrainConfig(steps=12, batch_size=16, rows=200, dim=4, checkpoint_every=5, reshard_at=6,
                      reshard_min_window=3, eval_rows=64, quiet=True, dense_parallel="ddp",
                      out=tempfile.mkdtemp(prefix="steady-"))
    real = ckpt.save_checkpoint

    def slow_save(*a, **k):   # a save far slower than a step: it must not show in the steady figure
        time.sleep(SAVE_SLEEP)
        return real(*a, **k)
    ckpt.save_checkpoint = slow_save
    seen = []
    real_progress = loop.TrainPipeline.progress

    def progress(self, it):
        seen.append(self.sharded._prefetched is None)
        return real_progress(self, it)
    loop.TrainPipeline.progress = progress
    try:
        trainer = loop.Trainer(cfg, worker_mesh((world,)))
        metrics = trainer.run()
    finally:
        ckpt.save_checkpoint = real
        loop.TrainPipeline.progress = real_progress
    return metrics, len(seen), trainer.elapsed


def test_steady_examples_per_s_counts_training_steps_only():
    metrics, pipelined_steps, elapsed = run_on_ranks(_job, 2, timeout=300)[0]
    assert pipelined_steps == 12   # every step went through the pipeline
    thr = metrics["throughput"]
    steady = thr["steady"]
    assert steady["excluded_steps"] == {"startup": [1, 2, 3], "reshard": [7], "checkpoint": [5, 10, 12]}, steady
    assert steady["steps_counted"] == 12 - 3 - 1 - 3
    assert steady["examples_per_step"] == 2 * 16
    want = steady["steps_counted"] * 32 / steady["seconds_counted"]
    assert abs(thr["steady_examples_per_s"] - want) <= 1e-6 * want
    # three saves slept SAVE_SLEEP each inside the run; none of that is in the counted seconds
    assert steady["seconds_counted"] < elapsed - 3 * SAVE_SLEEP, (steady, elapsed)
    assert metrics["reshards"] and metrics["reshards"][0]["step"] == 6
