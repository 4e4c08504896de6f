"""The training loop every rank runs: plan, shard, train, measure, reshard, checkpoint, report.

Example (inside an initialised process group; ``shardwise train`` does all of this)::

    from shardwise.train.loop import Trainer
    Trainer(TrainConfig(steps=40), mesh).run()
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ..embedding import Calibration, GreedyShardingPlanner, ShardingType, calibrate, shard
from . import checkpoint as ckpt
from .config import JOB_SHARDING_TYPES, TrainConfig
from .budget import budget_bytes, peak_rss_per_rank
from .sizes import job_tables
from .data import PerRank, Rows, SyntheticClicks, open_data, read_ahead, to_model_inputs
from .synthetic.drift import DRIFT_FEATURES, DriftingClicks
from .dense import make_dense_runner
from .model import DLRMDense, make_ebc, make_tables
from .report import Progress, console
from .replanning.replan import keep_plan, plan_from_json, plan_to_json
from .pipeline import TrainPipeline
from .launching.prelaunch import resumed_batch
from .replanning.reshard import live_reshard, measured_ids_per_bag, predicted_after
from .report.steady import Steady
from .report.steplog import StepLog
from .report import add_reshard, add_window, close_segment, new_story, open_segment
from .report.notices import drift_notice, reshard_notice, segment_notice

__all__ = ["Trainer", "plan_to_json", "plan_from_json"]

def open_click_logs_folder(folder: str):
    """A prepared folder, every row addressable on every rank (its rows are memory-mapped)."""
    from ..data import open_click_logs

    return open_click_logs([folder], 0, 1)


# steps that are not steady state: the first traces the compiled dense graph, the next ones still
# warm allocator and caches up
_WARMUP_STEPS = 3
_SPLIT_BYTES = 16 << 20   # text logs above this are split into per-rank stripes (each rank parses its own)


class Trainer:
    """One rank's share of the job; every method that talks is called on all ranks at the same step."""

    def __init__(self, cfg: TrainConfig, mesh, ranks_on_host: int = 1):
        self.cfg, self.mesh = cfg, mesh
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        meta = self._resume_meta()
        if meta is not None:   # the saved run's global batch is kept: the per-process batch follows the world
            cfg.batch_size = resumed_batch(meta["world"] * json.loads(meta["config"])["batch_size"], self.world)
        self.device = torch.device(mesh.device_type, torch.cuda.current_device()) \
            if mesh.device_type == "cuda" else torch.device(mesh.device_type)
        self.job_tables = job_tables(cfg)   # from the data's manifest or the flags (train/sizes.py)
        self.cards = self.job_tables.sizes
        self.memory_bytes, self.memory_source = budget_bytes(cfg.memory_per_rank_mb, self.device, ranks_on_host)
        self.data, self.eval_data, self.eval_source = self._open_logs()
        self.tables = make_tables(self.cards, cfg.dim)
        self.table_of = {f: t.name for t in self.tables for f in t.feature_names}
        # the planner's cost figures: measured (or given) on every rank, rank 0's kept, so every rank plans alike
        given = Calibration.from_json(cfg.calibration) if cfg.calibration is not None else None
        self.calibration = calibrate(self.device, given=given)
        self.planner = self.planner_for(self.world)
        self.step, self.cursor = 0, 0
        self.history: dict = {"step": [], "loss": [], "auc_step": [], "auc": [], "examples_per_s": []}
        self.reshard_state = "off" if cfg.reshard_at == 0 else "pending"   # -> "done" after the reshard
        self.story = new_story()
        self.elapsed = 0.0
        if meta is None:
            self.plan, moves = self.planner.plan(self.tables), {}
        else:   # the live plan of the saved run, kept wherever its ranks still exist
            self.plan, moves = keep_plan(plan_from_json(meta["plan"]), meta["world"], self.world, self.tables,
                                         self.planner)
        self._build(meta)
        self._open_segment(meta, moves)

    # ---- setup ------------------------------------------------------------------------------------
    def planner_for(self, world: int, ids_per_bag=1.0) -> GreedyShardingPlanner:
        """The job's planner for ``world`` ranks (the report estimates earlier segments' plans with it);
        the live reshard's has the measured ``ids_per_bag`` per table."""
        types = [ShardingType(t) for t in self.cfg.sharding_types or JOB_SHARDING_TYPES]
        return GreedyShardingPlanner(world, self.memory_bytes, memory_flag="--memory-per-rank",
                                      batch_size_per_rank=self.cfg.batch_size, ids_per_bag=ids_per_bag,
                                      sharding_types=types, calibration=self.calibration)

    def _open_logs(self) -> tuple:
        """(training log, held-out log, what the eval scores): the synthetic log's eval examples lie far
        beyond any training cursor; a file's come from --eval-data or its last --eval-fraction. Held-out
        text files are read at the end, each rank its own stripes (``self.eval_paths``); their raw ids,
        and a raw-id held-out folder's, go through the training folder's vocabulary (``self.eval_vocab``)."""
        from .evaluate import eval_vocabulary

        cfg = self.cfg
        data = self._open(cfg.data)
        self.eval_paths, self.eval_vocab = None, eval_vocabulary(self.job_tables.vocabulary, cfg.eval_data)
        via = " through the training vocabulary" if self.eval_vocab is not None else ""
        if cfg.eval_data:
            paths = [p for p in cfg.eval_data.split(",") if p]
            if len(paths) == 1 and Path(paths[0]).is_dir():
                return data, open_click_logs_folder(paths[0]), f"held-out folder {cfg.eval_data}{via}"
            self.eval_paths = paths
            return data, None, f"held-out file {cfg.eval_data}{via}"
        if cfg.eval_fraction:
            if not hasattr(data, "__len__"):
                raise ValueError(f"--eval-fraction needs to know where --data ends: prepare it first "
                                 f"(shardwise data prepare {cfg.data} --out DIR, then --data DIR) or pass --eval-data")
            n = len(data)
            cut = n - max(1, int(round(n * cfg.eval_fraction)))
            return Rows(data, 0, cut), Rows(data, cut, n), f"last {n - cut} of {n} rows of {cfg.data} (held out)"
        if isinstance(data, (SyntheticClicks, DriftingClicks)):
            return data, None, "held-out synthetic examples"
        return data, None, f"first rows of {cfg.data} (also trained on: pass --eval-data or --eval-fraction)"

    def _open(self, path: Optional[str]):
        """The synthetic log, a prepared folder (memory-mapped; every rank indexes the global rows) or
        text logs (comma-separated; each rank parses only its own stripes), where a bad line on one rank
        raises on every rank."""
        if not path:
            cfg = self.cfg
            log = open_data(None, cfg.seed, self.cards)
            if cfg.drift_at is None:
                return log
            # the global batch is the same in every segment of a run, so step -> example is fixed
            return DriftingClicks(log, cfg.drift_at * self.world * cfg.batch_size,
                                  cfg.drift_features or DRIFT_FEATURES, cfg.drift_factor)
        from ..data import AgreedReader, open_click_logs

        paths = [p for p in path.split(",") if p]
        if len(paths) == 1 and Path(paths[0]).is_dir():
            return open_click_logs(paths, 0, 1)
        # small logs: every rank reads all of it (global rows); large ones: each rank its own stripes
        split = sum(os.path.getsize(p) for p in paths) > _SPLIT_BYTES and self.world > 1
        reader = open_click_logs(paths, self.rank if split else 0, self.world if split else 1,
                                 skip_bad_lines=self.cfg.skip_bad_lines)
        reader = AgreedReader(reader, self.device)
        return PerRank(reader, self.rank, self.world) if split else reader

    def _resume_meta(self) -> Optional[dict]:
        if not self.cfg.resume:
            self._set_aside_old_checkpoints()
            return None
        self._ckpt_path = ckpt.resume_point(self.cfg)
        return ckpt.read_meta(self._ckpt_path)

    def _set_aside_old_checkpoints(self) -> None:
        """A fresh run must not leave an earlier run's later steps for a future --resume to pick up."""
        root = Path(self.cfg.checkpoint_path)
        if self.rank == 0 and ckpt.latest(root) is not None:
            prev = root.with_name(root.name + ".prev")
            shutil.rmtree(prev, ignore_errors=True)
            root.rename(prev)
            if not self.cfg.quiet:
                console.print(f"[yellow]earlier checkpoints moved to {prev} (this run starts fresh; "
                              f"pass --resume to continue one)[/]")
        dist.barrier()

    def _open_segment(self, meta: Optional[dict], moves: dict) -> None:
        """A new segment of the run's story: this process group, from this step, on this plan."""
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        kind = "restart" if restart else ("resume" if meta else "start")
        est = self.planner.estimate(self.plan, self.tables)
        open_segment(self.story, kind, self.world, self.step, plan_to_json(self.plan),
                     os.environ.get("TORCHELASTIC_RUN_ID"), restart, moves, est.memory, est.cost,
                     torch.get_num_threads())
        if self.rank == 0 and kind != "start":
            console.print(segment_notice(kind, restart, meta, self.world, moves))

    def _build(self, meta: Optional[dict]) -> None:
        cfg = self.cfg
        ebc = make_ebc(self.cards, cfg.dim, cfg.seed)
        opt = functools.partial(torch.optim.Adagrad, lr=cfg.lr_sparse)
        self.sparse = shard(ebc, self.plan, mesh=self.mesh, optimizer=opt, compile_optimizer=cfg.compile_update)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 1)
            arch = DLRMDense(len(self.tables), cfg.dim).to(self.device)
        self.dense = make_dense_runner(cfg.dense_parallel, arch, cfg.lr_dense, self.mesh)
        if meta is not None:
            self._load(meta)
        # the module counts its own lookups; a window of measured load starts here (a resumed run
        # measures its own processes and layout afresh)
        self.window_from = self.step

    def _state(self, template: bool = False) -> dict:
        dense = self.dense.state()
        if template:   # Adam's state is created lazily; give DCP tensors to load into
            dense["opt"] = {n: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                "exp_avg_sq": torch.zeros_like(p)} for n, p in dense["params"].items()}
        return {"sparse": self.sparse.state_dict(), "sparse_opt": self.sparse.fused_optimizer.state_dict(),
                "dense": dense}

    def _load(self, meta: dict) -> None:
        state = self._state(template=True)
        ckpt.load_checkpoint(self._ckpt_path, state)
        self.sparse.load_state_dict(state["sparse"])
        self.sparse.fused_optimizer.load_state_dict(state["sparse_opt"])
        self.dense.load(state["dense"])
        self.step, self.cursor, self.history = meta["step"], meta["cursor"], meta["history"]
        self.story, self.reshard_state = meta["story"], meta["reshard_state"]
        if self.reshard_state == "done" and meta["world"] != self.world:
            # the kept plan leaves new ranks with only replicated tables (or packs a lost rank's tables
            # by estimate): measure again on these processes and rebalance once more
            self.reshard_state = "pending"
        w = meta.get("open_window")
        if w:
            add_window(self.story, w["label"] + " (up to the checkpoint)", w["first"], meta["step"], w["per_rank"],
                       w.get("step_ms"))
        self.elapsed = meta["elapsed"]

    # ---- one step -------------------------------------------------------------------------------
    def _inputs(self, start: int, count: int):
        if isinstance(self.data, DriftingClicks):
            return self.data.model_inputs(start, count, self.cards, self.device)
        return to_model_inputs(self.data.batch(start, count), self.cards, self.device)

    def _batches(self):
        """This rank's slice of every remaining step's global batch, in order (the pipeline's data)."""
        b, per_step = self.cfg.batch_size, self.world * self.cfg.batch_size
        first = self.cursor + self.rank * b   # the cursor moves as steps train: read it once, here
        starts = (first + k * per_step for k in range(self.cfg.steps - self.step))
        return read_ahead(self._inputs, starts, b)

    def _train_batch(self, batch):
        """One training step on ``batch`` (the pipeline started its input dist already)."""
        dense, kjt, labels = batch
        pooled = self.sparse(kjt).values()
        # the fused optimizer updates the shards during the backward
        loss, logits = self.dense.train(dense, pooled, labels)
        self.cursor += self.world * self.cfg.batch_size
        self.step += 1
        return loss, logits, labels

    # ---- run ------------------------------------------------------------------------------------
    def run(self) -> Optional[dict]:
        cfg = self.cfg
        progress = Progress(cfg.steps, self.step, enabled=self.rank == 0 and not cfg.quiet)
        if self.rank == 0 and not cfg.quiet:
            from .report import print_plan
            print_plan(self.planner, self.plan, self.tables, "sharding plan")
        t0, seen0 = time.perf_counter(), self.step
        pipe, batches = TrainPipeline(step=self._train_batch, sharded=self.sparse), self._batches()
        self.steady, log = Steady(self.world * cfg.batch_size), StepLog(self.history)
        self._train(pipe, batches, log, progress, t0, seen0)
        self.elapsed += time.perf_counter() - t0
        return self.finish(seen0)

    def _train(self, pipe, batches, log: StepLog, progress: Progress, t0: float, seen0: int, until=None) -> None:
        cfg = self.cfg   # ``until``: stop before the run's end (benchmarks run the loop in blocks)
        with progress:
            while self.step < (cfg.steps if until is None else until):
                if cfg.drift_at and self.step == cfg.drift_at and self.step > self.window_from:
                    self._close_window("before the drift", progress)
                # the decision needs a window of measured load on this layout: after a resume or
                # restart the reshard waits until the new processes have measured enough steps
                resharded = self.reshard_state == "pending" and self.step >= cfg.reshard_at \
                    and self.step - self.window_from >= cfg.reshard_min_window
                if resharded:
                    self._reshard(progress)   # the pipeline re-routes its prefetched batch by itself
                t_step = time.perf_counter()
                loss, logits, labels = pipe.progress(batches)
                log.add(self.step, loss, logits, labels)
                if log.in_flight:   # the last log step's all-gather had this whole step to arrive
                    self._show(log, progress)
                if self.step == seen0 + 1:   # the first step traces the compiled graph: time from after it
                    t1 = time.perf_counter()
                saved = bool(cfg.checkpoint_every) and (self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps)
                shown = self.step % cfg.log_every == 0 or self.step == cfg.steps
                if shown or saved:   # a saved history holds every step's loss
                    self._log(log, progress, shown, saved or self.step == cfg.steps, seen0, t1)
                ckpt.fault_point("step", self.step)
                self.steady.add(self.step, time.perf_counter() - t_step,
                                "startup" if self.step - seen0 <= _WARMUP_STEPS else
                                "reshard" if resharded else "checkpoint" if saved else None)
                if saved:
                    self.elapsed_now = self.elapsed + time.perf_counter() - t0
                    self.save()

    def _log(self, log: StepLog, progress: Progress, shown: bool, final: bool, seen0: int, t1: float) -> None:
        """Collective: the steps since the last log get their global losses; at log steps also the
        window AUC, the running examples/s and the progress bar. Before a checkpoint and at the last
        step the history is completed now; at other log steps the all-gather runs in the background
        and the next step shows its numbers (:meth:`_show`), so no rank waits for the other here."""
        if shown:
            rate = (self.step - seen0 - 1) * self.world * self.cfg.batch_size / max(time.perf_counter() - t1, 1e-9)
            self.history["examples_per_s"].append(rate)
            self._shown = (self.step, rate)
        if shown and not final:
            log.start(with_auc=True)
            return
        loss_g, _ = log.flush(with_auc=shown)
        if shown:
            progress.update(self.step, loss_g, log.last_auc(), rate)

    def _show(self, log: StepLog, progress: Progress) -> None:
        """The progress bar at the last log step, once its all-gather has arrived."""
        loss_g, _ = log.collect()
        step, rate = self._shown
        progress.update(step, loss_g, log.last_auc(), rate)

    def _close_window(self, label: str, progress) -> list:
        """Collective: end the window of measured load at this step (its load and median step time go
        into the story) and start the next one."""
        stats = self.sparse.load_stats(reset=True)   # collective: the same numbers on every rank
        add_window(self.story, label, self.window_from, self.step, stats.per_rank(),
                   self.steady.median_ms(self.window_from, self.step))
        self.window_from = self.step
        if label == "before the drift" and self.rank == 0:
            progress.notice(drift_notice(self.step, self.cfg, self.story["windows"][-1]))
        return stats

    def _reshard(self, progress) -> None:
        first = self.window_from
        stats = self._close_window("before reshard", progress)
        before = stats.per_rank()
        # the planner that decides sees the ids per bag measured in the window, not those assumed at start-up
        planner = self.planner_for(self.world, measured_ids_per_bag(stats, self.tables, self.world * self.cfg.batch_size))
        budget = self.memory_bytes
        # the same figure bounds the bytes moved and, through the planner, the memory of every rank
        res = live_reshard(self.sparse, stats, self.plan, max_bytes_moved=budget, max_bytes_per_rank=budget,
                           planner=planner, tables=self.tables)
        old, new = planner.estimate(self.plan, self.tables), planner.estimate(res.plan, self.tables)
        rec = add_reshard(self.story, {
            "step": self.step, "status": res.status, "reason": res.reason, "changes": plan_to_json(res.changes),
            "measured_before": before, "memory_before": old.memory, "memory_after": new.memory,
            "estimated_before": old.cost, "estimated_after": new.cost, "stats": res.stats,
            "predicted_after": predicted_after(stats, res.plan, planner, self.tables),
            "step_ms_before": self.story["windows"][-1]["step_ms"], "window_before": [first, self.step],
            "plan_after": plan_to_json(res.plan)})
        self.plan, self.reshard_state = res.plan, "done"
        if self.rank == 0:
            progress.notice(reshard_notice(rec))
            if res.status == "applied" and not self.cfg.quiet:
                from .report import print_plan
                print_plan(planner, self.plan, self.tables, "sharding plan after the live reshard (estimates with "
                           "the measured ids per bag)")

    def _window_label(self) -> str:
        seg = len(self.story["segments"]) - 1
        here = [r for r in self.story["reshards"] if r["segment"] == seg]
        if not here:
            drift = [w for w in self.story["windows"] if w["segment"] == seg and w["label"] == "before the drift"]
            return "after the drift" if drift else "whole segment"
        return "after reshard" if here[-1]["status"] == "applied" else f"after reshard check ({here[-1]['status']})"

    def save(self) -> None:
        close_segment(self.story, self.step)
        # the window still open: a run resumed from this checkpoint shows it as its segment's last
        open_window = None if self.step == self.window_from else {
            "label": self._window_label(), "first": self.window_from, "per_rank": self.sparse.load_stats().per_rank(),
            "step_ms": self.steady.median_ms(self.window_from, self.step)}
        meta = {"open_window": open_window, "step": self.step, "cursor": self.cursor, "world": self.world, "plan": plan_to_json(self.plan),
                "history": self.history, "story": self.story, "reshard_state": self.reshard_state,
                "elapsed": getattr(self, "elapsed_now", self.elapsed), "config": self.cfg.to_json(),
                "table_sizes": list(self.cards), "vocab_digest": self.job_tables.vocab_digest}
        ckpt.save_checkpoint(self.cfg.checkpoint_path, self.step, self._state(), meta)

    # ---- the end ----------------------------------------------------------------------------------
    def evaluate(self) -> float:
        """AUC of the final model on the held-out rows (``self.eval_source`` says which): all of them,
        batched, each rank its share, unless ``--eval-rows`` caps them; sets ``self.eval_rows``."""
        from .evaluate import eval_parts, evaluate

        parts = eval_parts(self.data, self.eval_data, self.eval_paths, self.cfg.eval_rows, self.rank, self.world,
                           self.cfg.skip_bad_lines)
        # a drifted log's batches carry extra ids per bag: it builds their model inputs itself
        to_inputs = self.data.inputs_of if isinstance(self.data, DriftingClicks) else to_model_inputs
        res = evaluate(self.sparse, self.dense, parts, self.cards, self.device, self.eval_vocab, to_inputs)
        self.eval_rows, self.eval_oov_ids = res.rows, res.oov_ids
        return res.auc

    def finish(self, seen0: int) -> Optional[dict]:
        if self.step > self.window_from:
            add_window(self.story, self._window_label(), self.window_from, self.step,
                       self.sparse.load_stats().per_rank(), self.steady.median_ms(self.window_from, self.step))
        close_segment(self.story, self.step)
        self.peak_rss = peak_rss_per_rank(self.device)   # collective
        eval_auc = self.evaluate()
        bad = torch.tensor([getattr(self.data, "bad_lines", 0)], dtype=torch.int64, device=self.device)
        dist.all_reduce(bad)
        self.bad_lines = int(bad.item())   # skipped with --skip-bad-lines, all ranks
        if self.rank != 0:
            return None
        from .report import build_metrics, write_report
        metrics = build_metrics(self, eval_auc, seen0)
        write_report(self.cfg.out, metrics, self)
        return metrics
