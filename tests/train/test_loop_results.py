"""The job trains exactly what its library step trains: ``shardwise train``'s loop (the pipeline, the
data read on the fly, the log, checkpoints) gives every step's global loss bit for bit equal to the
plain step run by hand on the same batches; and for a fixed seed the loss curve, the window AUCs and
the eval AUC are the values recorded before the job's overhead was cut (commit 085b8bb; world 2, the
live reshard and checkpoints inside the run), so a faster job that trains differently fails here."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.distributed as dist

from shardwise.testing import run_on_ranks, worker_mesh


def _cfg(out: str, **kw):
    from shardwise.train.config import TrainConfig

    base = dict(steps=24, batch_size=32, rows=300, dim=4, checkpoint_every=10, reshard_at=0, eval_rows=128,
                quiet=True, log_every=5, dense_parallel="ddp", out=out)
    return TrainConfig(**{**base, **kw})


def _global_mean(loss: torch.Tensor) -> float:
    """What the job's log records: the ranks' float32 losses summed in rank order in float64, / world."""
    mine = loss.detach().reshape(1).to(torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    total = every[0].clone()
    for t in every[1:]:
        total += t
    return float(total / len(every))


def _job_and_plain(rank, world, out):
    from shardwise.train.loop import Trainer

    job = Trainer(_cfg(out + "/job"), worker_mesh((world,)))
    job.run()
    plain = Trainer(_cfg(out + "/plain"), worker_mesh((world,)))
    # the planner's cost figures are measured at start-up (two Trainers can plan differently, and a
    # data-parallel table rounds differently from a table-wise one): train on the plan the job chose
    plain.plan = job.plan
    plain._build(None)
    b, want = plain.cfg.batch_size, []
    for _ in range(plain.cfg.steps):   # the library step on this rank's slice of each global batch
        loss, _, _ = plain._train_batch(plain._inputs(plain.cursor + rank * b, b))
        want.append(_global_mean(loss))
    return job.history["step"], job.history["loss"], want


def test_job_losses_equal_the_plain_library_step():
    out = tempfile.mkdtemp(prefix="job-results-")
    for steps, got, want in run_on_ranks(_job_and_plain, 2, out, timeout=300):
        assert steps == list(range(1, 25))
        assert got == want   # bit for bit


def _golden_run(rank, world, out):
    from shardwise.train.loop import Trainer

    # table-wise only: whichever tables and ranks the measured calibration picks, the values are the same
    tr = Trainer(_cfg(out, reshard_at=12, reshard_min_window=5, sharding_types=["table_wise"]), worker_mesh((world,)))
    metrics = tr.run()
    return tr.history["loss"], tr.history["auc"], metrics["auc"]["eval"] if metrics else None


# recorded at commit 085b8bb (torch 2.13 CPU, table-wise only), before the job's overhead was cut
GOLDEN_LOSS = [0.7141420841217041, 0.7022461891174316, 0.6897384822368622, 0.6968534290790558, 0.7039944231510162,
               0.7008194327354431, 0.696310430765152, 0.6910740435123444, 0.6934822201728821, 0.6945323050022125,
               0.6920906007289886, 0.6950142681598663, 0.6888416707515717, 0.6949478387832642, 0.6831062138080597,
               0.6855729818344116, 0.6878416240215302, 0.6822042167186737, 0.6769756972789764, 0.6668015718460083,
               0.6754622757434845, 0.6875206828117371, 0.6732019484043121, 0.6422374546527863]
GOLDEN_AUC = [0.48317241379310344, 0.4643756888678948, 0.627140561934245, 0.7050830200501254, 0.6868061093050358]
GOLDEN_EVAL_AUC = 0.6928589078329627


def test_job_loss_curve_and_auc_unchanged_for_a_fixed_seed():
    (loss, aucs, eval_auc), (loss1, aucs1, _) = run_on_ranks(_golden_run, 2, tempfile.mkdtemp(prefix="golden-"),
                                                             timeout=300)
    assert loss == loss1 and aucs == aucs1   # every rank logs the same
    # float rounding of another CPU's kernels apart, the same run
    assert loss == pytest.approx(GOLDEN_LOSS, rel=0, abs=1e-6)
    assert aucs == pytest.approx(GOLDEN_AUC, rel=0, abs=1e-6)
    assert eval_auc == pytest.approx(GOLDEN_EVAL_AUC, rel=0, abs=1e-6)


def _loop_in_blocks(rank, world, out):
    import time

    from shardwise.train.loop import Trainer
    from shardwise.train.pipeline import TrainPipeline
    from shardwise.train.report import Progress
    from shardwise.train.report.steady import Steady
    from shardwise.train.report.steplog import StepLog

    whole = Trainer(_cfg(out + "/whole", checkpoint_every=0), worker_mesh((world,)))
    whole.run()
    parts = Trainer(_cfg(out + "/parts", checkpoint_every=0), worker_mesh((world,)))
    parts.plan = whole.plan
    parts._build(None)
    pipe, batches = TrainPipeline(step=parts._train_batch, sharded=parts.sparse), parts._batches()
    log, progress = StepLog(parts.history), Progress(parts.cfg.steps, 0, enabled=False)
    parts.steady = Steady(world * parts.cfg.batch_size)
    stops = []
    for until in (7, 16, 24):   # the loop run in blocks, as benchmarks/dlrm.py's job_loop runs it
        parts._train(pipe, batches, log, progress, time.perf_counter(), parts.step, until=until)
        stops.append(parts.step)
    return stops, whole.history, parts.history


def test_the_loop_run_in_blocks_trains_and_logs_as_one_run():
    for stops, whole, parts in run_on_ranks(_loop_in_blocks, 2, tempfile.mkdtemp(prefix="job-blocks-"), timeout=300):
        assert stops == [7, 16, 24]
        for key in ("step", "loss", "auc_step", "auc"):
            assert parts[key] == whole[key], key
