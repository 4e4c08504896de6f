"""The report folder (``metrics.json``, ``loss.png``, ``load.png``, ``plan.md``) and the plan table.

Two load figures appear and are named apart everywhere: the *estimated time* is the planner's model
(ms per step from the calibration measured at start-up, ids assumed uniform over rows), the
*measured load* is what the sharded module counted during the run. The report tells one run's
story by segments (start, resumes, restarts; see ``story.py``): nothing from two world sizes or two
layouts is drawn side by side.

Example:
    >>> from shardwise.embedding import EmbeddingBagConfig, GreedyShardingPlanner
    >>> tables = [EmbeddingBagConfig(5000, 4, "t0", feature_names=["f"])]
    >>> planner = GreedyShardingPlanner(2, 2**30); plan = planner.plan(tables)
    >>> print_plan(planner, plan, tables, "sharding plan")     # a table: rows x dim, sharding, ranks, bytes, ms
    sharding plan
    ...
    >>> write_report("shardwise-report", metrics, trainer)      # a training run's   # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table

from ...embedding import rank_ranges
from .progress import console
from .steady import Steady
from .story import run_counts

__all__ = ["plan_rows", "print_plan", "plan_markdown", "build_metrics", "write_report"]

_EST = "estimated ms/step (planner)"


def plan_rows(planner, plan: dict, tables) -> list[dict]:
    """One row per table: sharding type, ranks, bytes (weights + optimizer state), the planner's
    estimate of its shards' milliseconds per step (summed over ranks; the groups' fixed costs apart)."""
    est = planner.estimate(plan, tables)
    rows = []
    for t in tables:
        shards = est.shards[t.name]
        rows.append({"table": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
                     "sharding": plan[t.name].sharding_type.value,
                     "ranks": sorted({b.rank for b, _, _ in shards}),
                     "bytes": int(sum(b for _, b, _ in shards)),
                     "est_ms": float(sum(c for _, _, c in shards)) * 1e3})
    return rows


def print_plan(planner, plan: dict, tables, title: str) -> None:
    est = planner.estimate(plan, tables)
    table = Table(title=title)
    for col, just in (("table", "left"), ("rows x dim", "right"), ("sharding", "left"), ("ranks", "left"),
                      ("bytes", "right"), (_EST, "right")):
        table.add_column(col, justify=just)
    for r in plan_rows(planner, plan, tables):
        table.add_row(r["table"], f"{r['rows']}x{r['dim']}", r["sharding"], rank_ranges(r["ranks"]),
                      f"{r['bytes']:,}", f"{r['est_ms']:.4g}")
    console.print(table)
    console.print("per rank (weights + optimizer state; the planner's estimated ms per step): " + "  ".join(
        f"rank {i}: {m / 2**20:.1f} MiB, est. {c * 1e3:.3f} ms" for i, (m, c) in enumerate(zip(est.memory, est.cost))))
    console.print(f"estimated embedding time per step: {max(est.cost) * 1e3:.3f} ms (an estimate, not a "
                  f"measurement; calibration: {planner.calibration.source})")


def plan_markdown(planner, plan: dict, tables, title: str) -> str:
    lines = [f"{title}", "", f"| table | rows x dim | sharding | ranks | bytes | {_EST} |",
             "|---|---:|---|---|---:|---:|"]
    for r in plan_rows(planner, plan, tables):
        lines.append(f"| {r['table']} | {r['rows']}x{r['dim']} | {r['sharding']} | {rank_ranges(r['ranks'])} | "
                     f"{r['bytes']:,} | {r['est_ms']:.4g} |")
    return "\n".join(lines) + "\n\n" + _per_rank_markdown(planner.estimate(plan, tables))


def _per_rank_markdown(est) -> str:
    lines = ["| rank | memory (weights + optimizer state) | estimated ms/step |", "|---:|---:|---:|"]
    lines += [f"| {i} | {m / 2**20:.2f} MiB | {c * 1e3:.3f} |" for i, (m, c) in enumerate(zip(est.memory, est.cost))]
    return "\n".join(lines) + "\n"


def _reshard_summary(story: dict, reshard_state: str, cfg) -> dict:
    """What happened to the live reshard, in one line's worth of fields."""
    if story["reshards"] and reshard_state != "pending":
        r = story["reshards"][-1]
        return {"status": r["status"], "at_step": r["step"], "segment": r["segment"], "reason": r["reason"]}
    if reshard_state == "off":
        return {"status": "off", "at_step": None, "reason": "--reshard-at 0"}
    return {"status": "not-reached", "at_step": None,
            "reason": f"the run ended before a step >= {cfg.reshard_at} with a window of at least "
                      f"{cfg.reshard_min_window} steps measured on its last processes (--reshard-at, "
                      f"--reshard-min-window)"}


def build_metrics(tr, eval_auc: float, seen0: int) -> dict:
    """Everything the report shows, JSON-ready (nan becomes null)."""
    h, cfg, story = tr.history, tr.cfg, tr.story
    k = max(1, len(h["loss"]) // 10)
    counts = run_counts(story)
    steady = tr.steady.summary() if getattr(tr, "steady", None) is not None else Steady(0).summary()
    out = {
        "world_size": tr.world, "steps": tr.step, **counts, "elastic_restarts": counts["restarts"],
        "batch_size_per_rank": cfg.batch_size, "dense_parallel": cfg.dense_parallel,
        "data": cfg.data or f"synthetic(seed={cfg.seed})",
        "eval_data": tr.eval_source, "eval_rows": getattr(tr, "eval_rows", None),
        "eval_oov_ids": getattr(tr, "eval_oov_ids", 0), "bad_lines_skipped": getattr(tr, "bad_lines", 0),
        "table_sizes": list(tr.cards),
        "table_sizes_source": getattr(getattr(tr, "job_tables", None), "source", None),
        "memory_per_rank_bytes": tr.memory_bytes, "memory_per_rank_source": tr.memory_source,
        "loss": {"step": h["step"], "value": h["loss"],
                 "first": sum(h["loss"][:k]) / k, "last": sum(h["loss"][-k:]) / k},
        "auc": {"step": h["auc_step"], "train_window": h["auc"], "eval": eval_auc},
        "throughput": {"examples_per_s": h["examples_per_s"][-1] if h["examples_per_s"] else None,
                       "steps_this_segment": tr.step - seen0, "seconds_total": tr.elapsed,
                       # global examples/s over this segment's training steps only (report/steady.py)
                       "steady_examples_per_s": steady["examples_per_s"], "steady": steady},
        "reshard": _reshard_summary(story, tr.reshard_state, cfg),
        "segments": story["segments"], "load_windows": story["windows"], "reshards": story["reshards"],
        "plan_end": plan_rows(tr.planner, tr.plan, tr.tables),
        "calibration": tr.planner.calibration.to_json(),
        "plan_estimate": _plan_estimate(tr, h["examples_per_s"][-1] if h["examples_per_s"] else None),
        "memory_per_rank": _memory_per_rank(tr),
        "step_ms_around_reshards": _step_ms_around_reshards(tr),
        "config": json.loads(cfg.to_json()),
    }
    return _nan_to_none(out)


def _memory_per_rank(tr) -> list:
    """Per rank: the peak resident memory of its process (whole process, measured) next to what its
    tables must hold at the end (weights + optimizer state, the planner's count)."""
    held = tr.planner.estimate(tr.plan, tr.tables).memory
    rss = getattr(tr, "peak_rss", None) or [None] * len(held)
    return [{"rank": r, "peak_rss_bytes": rss[r], "tables_bytes": int(held[r])} for r in range(len(held))]


def _step_ms_around_reshards(tr) -> list:
    """Per reshard: the median measured step time of the window before it and of as many steps right
    after it (a window of the same length, so that a machine whose other load drifts over the run
    compares like with like), or of the window after it for an earlier segment's reshard. Reported
    only: the decision never reads them."""
    story, out = tr.story, []
    here = len(story["segments"]) - 1
    for r in story["reshards"]:
        first, last = r.get("window_before") or [r["step"], r["step"]]
        span = [r["step"], min(r["step"] + (last - first), tr.step)]
        after = tr.steady.median_ms(*span) if r["segment"] == here and getattr(tr, "steady", None) else None
        if after is None:
            ws = [w for w in story["windows"] if w["segment"] == r["segment"] and w["first_step"] == r["step"]]
            after, span = (ws[0].get("step_ms"), [ws[0]["first_step"], ws[0]["last_step"]]) if ws else (None, None)
        out.append({"step": r["step"], "status": r["status"], "before_ms": r.get("step_ms_before"),
                    "before_steps": [first, last], "after_ms": after, "after_steps": span})
    return out


def _plan_estimate(tr, examples_per_s) -> dict:
    """The planner's estimate for the plan in force at the end, beside the measured whole step."""
    rec = tr.planner.estimate_record(tr.planner.estimate(tr.plan, tr.tables))
    rec["measured_step_ms"] = (tr.world * tr.cfg.batch_size / examples_per_s * 1e3) if examples_per_s else None
    rec["measured_note"] = "the whole measured step (dense part, data and every collective included)"
    return rec


def _nan_to_none(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def _segment_title(seg: dict) -> str:
    how = {"start": "start", "resume": "resume", "restart": f"elastic restart {seg['attempt']}"}[seg["kind"]]
    n = seg["world_size"]
    return f"segment {seg['index'] + 1} ({how}): {n} rank{'s' if n != 1 else ''}, steps {seg['first_step']}-{seg['last_step']}"


def _plans_markdown(tr) -> str:
    """The plan at each segment's start and after each reshard, a table only where it changed."""
    from ..replanning.replan import placements, plan_from_json

    md, shown = ["# Sharding plans of the run", ""], None
    for seg in tr.story["segments"]:
        md += [f"## {_segment_title(seg)}", ""]
        planner = tr.planner_for(seg["world_size"])
        if seg["moves"]:
            md += ["Kept the saved plan except these tables, placed anew:", ""]
            md += [f"- {t}: {m['from']} -> {m['to']} ({m['why']})" for t, m in seg["moves"].items()] + [""]
        layout = placements(plan_from_json(seg["plan"]), seg["world_size"])
        if layout != shown:
            md.append(plan_markdown(planner, plan_from_json(seg["plan"]), tr.tables, "Plan in force:"))
        else:
            md += ["Plan: every table where it was at the end of the previous segment.", "", _per_rank_markdown(
                planner.estimate(plan_from_json(seg["plan"]), tr.tables))]
        shown = layout
        for r in (r for r in tr.story["reshards"] if r["segment"] == seg["index"]):
            md += [f"### Live reshard at step {r['step']}: {r['status']}", ""]
            if r["status"] != "applied":
                md += [r["reason"], ""]
                continue
            md += ["moved: " + ", ".join(f"{t} -> {v['type']}{'' if v['ranks'] is None else v['ranks']}"
                                         for t, v in r["changes"].items()), "",
                   "memory per rank (weights + optimizer state), before -> after: " + ", ".join(
                       f"rank {i}: {a / 2**20:.2f} -> {b / 2**20:.2f} MiB"
                       for i, (a, b) in enumerate(zip(r["memory_before"], r["memory_after"]))), ""]
            md.append(plan_markdown(planner, plan_from_json(r["plan_after"]), tr.tables, "Plan after the reshard:"))
            shown = placements(plan_from_json(r["plan_after"]), seg["world_size"])
    return "\n".join(md) + "\n"


def write_report(out, metrics: dict, tr) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (folder / "plan.md").write_text(_plans_markdown(tr))
    _plot_loss(folder / "loss.png", metrics)
    _plot_load(folder / "load.png", metrics)
    if not tr.cfg.quiet:
        _print_summary(metrics, folder)


def _figure(**kw):
    # a bare Figure draws and saves with the Agg renderer by itself: no pyplot, so the process's
    # backend (a user's notebook or GUI session) is never switched by writing a report
    from matplotlib.figure import Figure

    return Figure(**kw)


def _events(m: dict) -> list:
    """(step, label, colour, style) of what the loss plot marks: resumes and restarts, the drift, reshards."""
    ev = [(seg["first_step"], f"{seg['kind']} on {seg['world_size']} ranks", "tab:gray", ":")
          for seg in m["segments"][1:]]
    ev += [(w["last_step"], "drift (--drift-at)", "tab:purple", "-.") for w in m["load_windows"]
           if w["label"] == "before the drift"]
    ev += [(r["step"], f"reshard ({r['status']})", "tab:red", "--") for r in m["reshards"]]
    return sorted(ev, key=lambda e: e[0])


def _plot_loss(path: Path, m: dict) -> None:
    _loss_figure(m).savefig(path, dpi=110)


def _loss_figure(m: dict):
    """Loss, window AUC, the eval AUC as a point at the last step, and the run's events; the legend below."""
    fig = _figure(figsize=(8, 5))
    ax = fig.subplots()
    ax.plot(m["loss"]["step"], m["loss"]["value"], lw=0.8, color="tab:blue", label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (BCE)")
    ax2 = ax.twinx()
    pts = [(s, a) for s, a in zip(m["auc"]["step"], m["auc"]["train_window"]) if a is not None]
    if pts:
        ax2.plot(*zip(*pts), color="tab:orange", lw=0.8, marker="o", markersize=2.5, label="train AUC (window)")
    if m["auc"]["eval"] is not None:
        last = m["loss"]["step"][-1] if m["loss"]["step"] else 0
        ax2.plot([last], [m["auc"]["eval"]], color="tab:green", marker="*", markersize=13, ls="none",
                 label=f"eval AUC {m['auc']['eval']:.3f} ({m.get('eval_data', 'held out')})")
    ax2.set_ylabel("AUC")
    _clip_spikes(ax, m["loss"]["value"])
    # each event a line with its label above the plot (off the curves), staggered so that events at
    # nearby steps stay apart
    events = _events(m)
    for i, (step, label, colour, style) in enumerate(events):
        ax.axvline(step, color=colour, ls=style, lw=1.2, label=f"{label}, step {step}")
        ax.annotate(label, (step, 1.0), xycoords=("data", "axes fraction"), xytext=(2, 3 + 10 * (i % 3)),
                    textcoords="offset points", fontsize=7, color=colour)
    lines, lines2 = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
    # the legend below the axes: it never covers the curves
    fig.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower center", ncol=2, fontsize=7.5, frameon=False)
    ax.set_title(f"DLRM: loss and AUC over {len(m['segments'])} segment(s)", pad=8 + 10 * min(len(events), 3))
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(lines[1]) + len(lines2[1]) + 1) // 2), 1, 1))
    return fig


def _clip_spikes(ax, values: list) -> None:
    """A loss spike (the drift's first steps: 128 ids summed into one bag) would flatten the rest of the
    curve: the axis stops at 1.5x the 99th percentile, and the axis label gives the clipped peak."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if len(xs) < 20:
        return
    top = 1.5 * xs[int(0.99 * (len(xs) - 1))]
    if xs[-1] > top:
        ax.set_ylim(0, top)
        ax.set_ylabel(f"loss (BCE; clipped at {top:.2f}, peak {xs[-1]:.2f})")


def _plot_load(path: Path, m: dict) -> None:
    """One panel per segment (its own ranks), its windows side by side: before / after a reshard."""
    segs = [s for s in m["segments"] if any(w["segment"] == s["index"] for w in m["load_windows"])] or m["segments"][-1:]
    fig = _figure(figsize=(6.5 * len(segs), 5))
    axes = fig.subplots(1, len(segs), squeeze=False)
    top = max([max(w["per_rank"]) for w in m["load_windows"]] + [1.0]) * 1.05
    for ax, seg in zip(axes[0], segs):
        windows = [w for w in m["load_windows"] if w["segment"] == seg["index"]]
        width = 0.8 / max(len(windows), 1)
        for i, w in enumerate(windows):
            xs = [r + i * width for r in range(seg["world_size"])]
            ax.bar(xs, w["per_rank"], width, label=f"{w['label']}, steps {w['first_step']}-{w['last_step']} "
                                                   f"(max/mean {_fmt(w['max_over_mean'], '.2f')}, median step "
                                                   f"{_fmt(w.get('step_ms'), '.1f')} ms)")
        ax.set_xticks([r + width * (len(windows) - 1) / 2 for r in range(seg["world_size"])])
        ax.set_xticklabels([f"rank {r}" for r in range(seg["world_size"])])
        ax.set_ylabel("measured lookups (ids x dim) per step")
        ax.set_title(_segment_title(seg), fontsize=9)
        ax.set_ylim(0, top)
        if windows:   # below the bars: it never covers them
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    fig.suptitle("measured per-rank embedding lookup load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _print_summary(m: dict, folder: Path) -> None:
    t = Table(title="final figures")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("steps", str(m["steps"]))
    t.add_row("loss (first 10% -> last 10%)", f"{m['loss']['first']:.4f} -> {m['loss']['last']:.4f}")
    t.add_row(f"eval AUC ({m.get('eval_data', 'held-out examples')}; {m.get('eval_rows')} rows scored)",
              _fmt(m["auc"]["eval"], ".4f"))
    t.add_row("table sizes", f"{min(m['table_sizes'])}..{max(m['table_sizes'])} rows"
              + (f" ({m['table_sizes_source']})" if m.get("table_sizes_source") else ""))
    t.add_row("memory budget per rank", f"{m['memory_per_rank_bytes'] / 2**20:,.0f} MiB "
              f"({m['memory_per_rank_source']})")
    t.add_row("examples/s (last segment)", _fmt(m["throughput"]["examples_per_s"], ",.0f"))
    t.add_row("steady examples/s (training steps only)", _fmt(m["throughput"].get("steady_examples_per_s"), ",.0f"))
    t.add_row("  median of 20-step blocks", _fmt((m["throughput"].get("steady") or {}).get("block_examples_per_s"),
                                                  ",.0f"))
    t.add_row("resumes / elastic restarts", f"{m['resumes']} / {m['restarts']}")
    if m["config"].get("skip_bad_lines"):
        t.add_row("malformed lines skipped (--skip-bad-lines; lines this run read)", f"{m['bad_lines_skipped']:,}")
    mem = m.get("memory_per_rank") or []
    if mem:
        t.add_row("per rank: peak RSS (whole process) / tables held", "  ".join(
            f"{_mib(x['peak_rss_bytes'])}/{_mib(x['tables_bytes'])}" for x in mem) + " MiB")
    for x in m.get("step_ms_around_reshards") or []:
        steps = "" if not x["after_steps"] else (f" (steps {x['before_steps'][0]}-{x['before_steps'][1]} -> "
                                                 f"{x['after_steps'][0]}-{x['after_steps'][1]})")
        t.add_row(f"median step time around the reshard at step {x['step']} ({x['status']}){steps}",
                  f"{_fmt(x['before_ms'], '.1f')} -> {_fmt(x['after_ms'], '.1f')} ms")
    for seg in m["segments"]:
        t.add_row(_segment_title(seg), "")
        for r in (r for r in m["reshards"] if r["segment"] == seg["index"]):
            t.add_row(f"  live reshard at step {r['step']}", r["status"])
            if r["status"] == "applied":
                t.add_row("  memory per rank (MiB), before -> after", "  ".join(
                    f"{a / 2**20:.1f}->{b / 2**20:.1f}" for a, b in zip(r["memory_before"], r["memory_after"])))
        for w in (w for w in m["load_windows"] if w["segment"] == seg["index"]):
            t.add_row(f"  {w['label']} (steps {w['first_step']}-{w['last_step']}): measured load max/mean, "
                      f"median step time", f"{_fmt(w['max_over_mean'], '.2f')}, {_fmt(w.get('step_ms'), '.1f')} ms")
    if m["reshard"]["status"] in ("off", "not-reached"):
        t.add_row("live reshard", f"{m['reshard']['status']}: {m['reshard']['reason']}")
    t.add_row("report", str(folder))
    console.print(t)
