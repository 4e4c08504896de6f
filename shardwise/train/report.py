"""The report folder (``metrics.json``, ``loss.png``, ``load.png``, ``plan.md``) and the plan table.

Example:
    >>> print_plan(planner, plan, tables, "sharding plan")     # doctest: +SKIP
    >>> write_report("shardwise-report", metrics, trainer)      # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rich.table import Table

from .progress import console

__all__ = ["plan_rows", "print_plan", "plan_markdown", "build_metrics", "write_report"]


def plan_rows(planner, plan: dict, tables) -> list[dict]:
    """One row per table: sharding type, ranks, bytes (weights + optimizer state), estimated load."""
    est = planner.estimate(plan, tables)
    rows = []
    for t in tables:
        shards = est.shards[t.name]
        rows.append({"table": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
                     "sharding": plan[t.name].sharding_type.value,
                     "ranks": sorted({b.rank for b, _, _ in shards}),
                     "bytes": int(sum(b for _, b, _ in shards)),
                     "est_load": float(sum(c for _, _, c in shards))})
    return rows


def print_plan(planner, plan: dict, tables, title: str) -> None:
    est = planner.estimate(plan, tables)
    table = Table(title=title)
    for col, just in (("table", "left"), ("rows x dim", "right"), ("sharding", "left"), ("ranks", "left"),
                      ("bytes", "right"), ("est. load (ids*dim/step)", "right")):
        table.add_column(col, justify=just)
    for r in plan_rows(planner, plan, tables):
        table.add_row(r["table"], f"{r['rows']}x{r['dim']}", r["sharding"], str(r["ranks"]),
                      f"{r['bytes']:,}", f"{r['est_load']:,.0f}")
    console.print(table)
    console.print("per rank: " + "  ".join(f"rank {i}: {m / 2**20:.1f} MiB, load {c:,.0f}"
                                           for i, (m, c) in enumerate(zip(est.memory, est.cost))))


def plan_markdown(planner, plan: dict, tables, title: str) -> str:
    lines = [f"## {title}", "", "| table | rows x dim | sharding | ranks | bytes | est. load (ids*dim/step) |",
             "|---|---:|---|---|---:|---:|"]
    for r in plan_rows(planner, plan, tables):
        lines.append(f"| {r['table']} | {r['rows']}x{r['dim']} | {r['sharding']} | {r['ranks']} | "
                     f"{r['bytes']:,} | {r['est_load']:,.0f} |")
    est = planner.estimate(plan, tables)
    lines += ["", "| rank | bytes | est. load |", "|---:|---:|---:|"]
    lines += [f"| {i} | {m:,} | {c:,.0f} |" for i, (m, c) in enumerate(zip(est.memory, est.cost))]
    return "\n".join(lines) + "\n"


def _imbalance(per_rank: list) -> float:
    mean = sum(per_rank) / len(per_rank)
    return max(per_rank) / mean if mean else float("nan")


def build_metrics(tr, eval_auc: float, seen0: int) -> dict:
    """Everything the report shows, JSON-ready (nan becomes null)."""
    h, cfg = tr.history, tr.cfg
    ran = tr.step - seen0
    k = max(1, len(h["loss"]) // 10)
    windows = [{**w, "imbalance": _imbalance(w["per_rank"])} for w in tr.load_windows]
    out = {
        "world_size": tr.world, "steps": tr.step,
        "elastic_restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), "batch_size_per_rank": cfg.batch_size,
        "dense_parallel": cfg.dense_parallel, "data": cfg.data or f"synthetic(seed={cfg.seed})",
        "loss": {"step": h["step"], "value": h["loss"],
                 "first": sum(h["loss"][:k]) / k, "last": sum(h["loss"][-k:]) / k},
        "auc": {"step": h["auc_step"], "train_window": h["auc"], "eval": eval_auc},
        "throughput": {"examples_per_s": h["examples_per_s"][-1] if h["examples_per_s"] else None,
                       "steps_this_run": ran, "seconds_total": tr.elapsed},
        "reshard": {**tr.reshard_info, "load_windows": windows},
        "plan_before": plan_rows(tr.planner, tr.plan_before, tr.tables),
        "plan_after": plan_rows(tr.planner, tr.plan, tr.tables),
        "config": json.loads(cfg.to_json()),
    }
    return _nan_to_none(out)


def _nan_to_none(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def write_report(out, metrics: dict, tr) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1))
    md = plan_markdown(tr.planner, tr.plan_before, tr.tables, "Plan before the reshard")
    if tr.reshard_info.get("status") == "applied":
        md += "\n" + plan_markdown(tr.planner, tr.plan, tr.tables, "Plan after the reshard")
    else:
        md += f"\nNo live reshard was applied ({tr.reshard_info.get('status')}): " \
              f"{tr.reshard_info.get('reason') or 'the plan above was used throughout'}\n"
    (folder / "plan.md").write_text(md)
    _plot_loss(folder / "loss.png", metrics)
    _plot_load(folder / "load.png", metrics)
    if not tr.cfg.quiet:
        _print_summary(metrics, folder)


def _plot_loss(path: Path, m: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(m["loss"]["step"], m["loss"]["value"], lw=0.8, color="tab:blue", label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (BCE)")
    ax2 = ax.twinx()
    pts = [(s, a) for s, a in zip(m["auc"]["step"], m["auc"]["train_window"]) if a is not None]
    if pts:
        ax2.plot(*zip(*pts), color="tab:orange", marker=".", label="train AUC")
    ax2.set_ylabel("AUC")
    rs = m["reshard"]
    if rs.get("status") in ("applied", "no-change", "unavailable", "failed"):
        ax.axvline(rs["at_step"], color="tab:red", ls="--", label=f"reshard ({rs['status']})")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right")
    ax.set_title(f"DLRM on {m['world_size']} ranks: loss and AUC (eval AUC {m['auc']['eval'] or float('nan'):.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_load(path: Path, m: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = m["reshard"]["load_windows"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / max(len(windows), 1)
    for i, w in enumerate(windows):
        xs = [r + i * width for r in range(len(w["per_rank"]))]
        ax.bar(xs, w["per_rank"], width, label=f"{w['label']} (max/mean {_fmt(w['imbalance'], '.2f')})")
    ax.set_xticks([r + width * (len(windows) - 1) / 2 for r in range(m["world_size"])])
    ax.set_xticklabels([f"rank {r}" for r in range(m["world_size"])])
    ax.set_ylabel("measured lookups (ids x dim) per step")
    ax.set_title("per-rank embedding lookup load")
    ax.set_ylim(0, max([max(w["per_rank"]) for w in windows] + [1.0]) * 1.3)   # room for the legend
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _print_summary(m: dict, folder: Path) -> None:
    t = Table(title="final figures")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("steps", str(m["steps"]))
    t.add_row("loss (first 10% -> last 10%)", f"{m['loss']['first']:.4f} -> {m['loss']['last']:.4f}")
    t.add_row("eval AUC", _fmt(m["auc"]["eval"], ".4f"))
    t.add_row("examples/s", _fmt(m["throughput"]["examples_per_s"], ",.0f"))
    t.add_row("reshard", str(m["reshard"].get("status")))
    for w in m["reshard"]["load_windows"]:
        t.add_row(f"load max/mean ({w['label']})", _fmt(w["imbalance"], ".2f"))
    t.add_row("report", str(folder))
    console.print(t)
