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


def test_block_figure_is_the_median_of_block_means():
    """``block_ms``: counted steps in step order, in blocks of 20 (a last, shorter block left out; excluded
    steps skipped), each block's mean, their median -- the statistic benchmarks/dlrm.py takes of the
    library step, so one slow step moves neither figure."""
    from shardwise.train.report.steady import BLOCK_STEPS, Steady

    s = Steady(examples_per_step=100)
    assert s.summary()["block_ms"] is None and BLOCK_STEPS == 20
    secs = [0.010] * 20 + [0.030] * 19 + [1.0] + [0.020] * 20 + [5.0] * 7   # 3 full blocks, 7 left over
    step = 0
    for x in secs:
        step += 1
        if step == 30:
            s.add(step, 99.0, "checkpoint")   # not counted: the next counted step takes its place
            step += 1
        s.add(step, x, None)
    blocks = sorted([0.010, (0.030 * 19 + 1.0) / 20, 0.020])
    got = s.summary()
    assert abs(got["block_ms"] - 1e3 * blocks[1]) < 1e-9
    assert abs(got["block_examples_per_s"] - 100 / blocks[1]) < 1e-6
    assert got["steps_counted"] == len(secs)
