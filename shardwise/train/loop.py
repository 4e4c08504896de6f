"""The training loop every rank runs: plan, shard, train, measure, reshard, checkpoint, report.

Example (inside an initialised process group; ``shardwise train`` does all of this)::

    from shardwise.train.loop import Trainer
    Trainer(TrainConfig(steps=40), mesh).run()
"""

from __future__ import annotations

import functools
import shutil
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ..embedding import EmbeddingShardingPlanner, ParameterSharding, ShardingType, shard
from . import checkpoint as ckpt
from .config import TrainConfig
from .data import SyntheticClicks, default_cardinalities, open_data, to_model_inputs
from .dense import make_dense_runner
from .model import DenseArch, auc, make_ebc, make_tables
from .progress import Progress, console
from .reshard import live_reshard

__all__ = ["Trainer", "plan_to_json", "plan_from_json"]

_EVAL_START = 1 << 40
# Row-wise splits of power-law tables put the hot rows on one rank, the imbalance a measured-load
# reshard exists to fix; column-wise would hide it (every rank serves every id), so it is left out.
_SHARDING_TYPES = (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL)   # synthetic eval examples come from far beyond any training cursor


def plan_to_json(plan: dict) -> dict:
    return {t: {"type": ps.sharding_type.value, "ranks": None if ps.ranks is None else list(ps.ranks),
                "host": ps.host_index} for t, ps in plan.items()}


def plan_from_json(raw: dict) -> dict:
    return {t: ParameterSharding(ShardingType(v["type"]), None if v["ranks"] is None else tuple(v["ranks"]),
                                 v["host"]) for t, v in raw.items()}


class Trainer:
    """One rank's share of the job; every method that talks is called on all ranks at the same step."""

    def __init__(self, cfg: TrainConfig, mesh):
        self.cfg, self.mesh = cfg, mesh
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(mesh.device_type, torch.cuda.current_device()) \
            if mesh.device_type == "cuda" else torch.device(mesh.device_type)
        self.cards = default_cardinalities(cfg.rows)
        self.data = open_data(cfg.data, cfg.seed, self.cards)
        self.tables = make_tables(self.cards, cfg.dim)
        self.table_of = {f: t.name for t in self.tables for f in t.feature_names}
        self.planner = EmbeddingShardingPlanner(self.world, int(cfg.memory_per_rank_mb * 2**20),
                                                batch_size_per_rank=cfg.batch_size, ids_per_bag=1.0,
                                                sharding_types=_SHARDING_TYPES)
        self.step, self.cursor = 0, 0
        self.history: dict = {"step": [], "loss": [], "auc_step": [], "auc": [], "examples_per_s": []}
        self.reshard_info: dict = {"status": "off" if cfg.reshard_at == 0 else "pending", "at_step": cfg.reshard_at}
        self.load_windows: list = []
        self.elapsed = 0.0
        meta = self._resume_meta()
        self.plan_before = plan_from_json(meta["plan_before"]) if meta else self.planner.plan(self.tables)
        self.plan = self._plan_for_resume(meta) if meta else dict(self.plan_before)
        self._build(meta)

    # ---- setup ------------------------------------------------------------------------------------
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

    def _plan_for_resume(self, meta: dict) -> dict:
        if meta["world"] == self.world:
            return plan_from_json(meta["plan"])
        # another world size: a fresh plan for these ranks; DCP moves every shard where it now lives
        self.plan_before = self.planner.plan(self.tables)
        return dict(self.plan_before)

    def _build(self, meta: Optional[dict]) -> None:
        cfg = self.cfg
        ebc = make_ebc(self.cards, cfg.dim, cfg.seed)
        opt = functools.partial(torch.optim.Adagrad, lr=cfg.lr_sparse)
        self.sparse = shard(ebc, self.plan, mesh=self.mesh, optimizer=opt)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 1)
            arch = DenseArch(len(self.tables), cfg.dim).to(self.device)
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
        self.reshard_info, self.load_windows = meta["reshard"], meta["load_windows"]
        self.elapsed = meta["elapsed"]
        if self.world != meta["world"]:
            self.reshard_info = {**self.reshard_info, "note": f"resumed on {self.world} ranks (saved on "
                                 f"{meta['world']}): replanned"}

    # ---- one step -------------------------------------------------------------------------------
    def _inputs(self, start: int, count: int):
        return to_model_inputs(self.data.batch(start, count), self.cards, self.device)

    def train_step(self):
        b = self.cfg.batch_size
        dense, kjt, labels = self._inputs(self.cursor + self.rank * b, b)
        pooled = self.sparse(kjt).values()
        loss, logits, grad_pooled = self.dense.step(dense, pooled, labels)
        pooled.backward(grad_pooled)   # the fused optimizer updates the shards during this backward
        self.cursor += self.world * b
        self.step += 1
        return loss, logits, labels

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t.contiguous())
        return torch.cat(out)

    def _global_mean(self, loss: torch.Tensor) -> float:
        t = loss.detach().reshape(1).to(torch.float64)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    # ---- run ------------------------------------------------------------------------------------
    def run(self) -> Optional[dict]:
        cfg = self.cfg
        progress = Progress(cfg.steps, self.step, enabled=self.rank == 0 and not cfg.quiet)
        if self.rank == 0 and not cfg.quiet:
            from .report import print_plan
            print_plan(self.planner, self.plan, self.tables, "sharding plan")
        window, t0, seen0 = [], time.perf_counter(), self.step
        with progress:
            while self.step < cfg.steps:
                if self.step >= cfg.reshard_at and self.reshard_info["status"] == "pending" \
                        and self.step > self.window_from:
                    self._reshard(progress)
                loss, logits, labels = self.train_step()
                window.append((torch.sigmoid(logits), labels))
                loss_g = self._global_mean(loss)
                self.history["step"].append(self.step)
                self.history["loss"].append(loss_g)
                if self.step == seen0 + 1:   # the first step traces the compiled graph: time from after it
                    t1 = time.perf_counter()
                rate = (self.step - seen0 - 1) * self.world * cfg.batch_size / max(time.perf_counter() - t1, 1e-9)
                if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                    a = auc(self._gather(torch.cat([p for p, _ in window])),
                            self._gather(torch.cat([y for _, y in window])))
                    window = []
                    self.history["auc_step"].append(self.step)
                    self.history["auc"].append(a)
                    self.history["examples_per_s"].append(rate)
                ckpt.fault_point("step", self.step)
                progress.update(self.step, loss_g, self.history["auc"][-1] if self.history["auc"] else None, rate)
                if cfg.checkpoint_every and (self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps):
                    self.elapsed_now = self.elapsed + time.perf_counter() - t0
                    self.save()
        self.elapsed += time.perf_counter() - t0
        return self.finish(seen0)

    def _reshard(self, progress) -> None:
        stats = self.sparse.load_stats(reset=True)   # collective: the same numbers on every rank
        before = stats.per_rank()
        self.load_windows.append({"label": "before reshard", "steps": self.step - self.window_from,
                                  "per_rank": before, "plan": plan_to_json(self.plan)})
        max_bytes = int(self.cfg.memory_per_rank_mb * 2**20)
        res = live_reshard(self.sparse, stats, self.plan, max_bytes)
        self.reshard_info = {"status": res.status, "at_step": self.step, "reason": res.reason,
                             "changes": plan_to_json(res.changes), "load_before": before, "stats": res.stats}
        self.plan = res.plan
        self.window_from = self.step
        if self.rank == 0:
            progress.notice(_reshard_notice(res, self.step))
            if res.status == "applied" and not self.cfg.quiet:
                from .report import print_plan
                print_plan(self.planner, self.plan, self.tables, "sharding plan after the live reshard")

    def save(self) -> None:
        meta = {"step": self.step, "cursor": self.cursor, "world": self.world, "plan": plan_to_json(self.plan),
                "plan_before": plan_to_json(self.plan_before), "history": self.history,
                "reshard": self.reshard_info, "load_windows": self.load_windows,
                "elapsed": getattr(self, "elapsed_now", self.elapsed), "config": self.cfg.to_json()}
        ckpt.save_checkpoint(self.cfg.checkpoint_path, self.step, self._state(), meta)

    # ---- the end ----------------------------------------------------------------------------------
    def evaluate(self) -> float:
        """AUC of the final model on held-out synthetic examples (or the file's first examples)."""
        n = max(self.cfg.eval_examples // self.world, 1)
        start = _EVAL_START if isinstance(self.data, SyntheticClicks) else 0
        dense, kjt, labels = self._inputs(start + self.rank * n, n)
        with torch.no_grad():
            pooled = self.sparse(kjt).values()
        scores = torch.sigmoid(self.dense.predict(dense, pooled))
        return auc(self._gather(scores), self._gather(labels))

    def finish(self, seen0: int) -> Optional[dict]:
        label = "after reshard" if self.reshard_info["status"] == "applied" else \
            ("whole run" if self.reshard_info["status"] == "off" else "after (reshard not applied)")
        if self.step > self.window_from:
            self.load_windows.append({"label": label, "steps": self.step - self.window_from,
                                      "per_rank": self.sparse.load_stats().per_rank(), "plan": plan_to_json(self.plan)})
        eval_auc = self.evaluate()
        if self.rank != 0:
            return None
        from .report import build_metrics, write_report
        metrics = build_metrics(self, eval_auc, seen0)
        write_report(self.cfg.out, metrics, self)
        return metrics


def _reshard_notice(res, step: int) -> str:
    if res.status == "applied":
        moved = ", ".join(f"{t} -> {v['type']}{'' if v['ranks'] is None else v['ranks']}"
                          for t, v in plan_to_json(res.changes).items())
        sent = res.stats.get("bytes_sent")
        size = f" ({sum(sent) / 2**20:.2f} MiB moved in {res.stats.get('wall_time_s', 0):.2f}s)" if sent else ""
        return f"[bold green]live reshard at step {step}[/]: {moved}{size}"
    if res.status == "no-change":
        return f"[yellow]reshard check at step {step}: measured load is balanced; plan kept[/]"
    return f"[bold red]reshard at step {step} {'failed' if res.status == 'failed' else 'skipped'}:[/] {res.reason}"

