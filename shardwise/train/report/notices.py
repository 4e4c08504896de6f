"""The console's lines for the events of a run: a resume or restart, the drift, the live reshard.

Example:
    >>> rec = {"step": 500, "status": "no-change", "reason": "the measured load cannot be lowered"}
    >>> reshard_notice(rec)
    '[yellow]reshard check at step 500: the measured load cannot be lowered; plan kept[/]'
"""

from __future__ import annotations

import os
from typing import Optional

from .story import max_over_mean

__all__ = ["segment_notice", "reshard_notice", "drift_notice"]


def _ranks(xs: list, fmt: str) -> str:
    return "  ".join(f"rank {r}: {format(x, fmt)}" for r, x in enumerate(xs))


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def drift_notice(step: int, cfg, window: dict) -> str:
    """The drift has begun: which features, and the window of load measured before it."""
    from ..synthetic.drift import DRIFT_FEATURES

    feats = ", ".join(cfg.drift_features or DRIFT_FEATURES)
    return (f"[bold magenta]drift at step {step}[/] (--drift-at): {feats} now carry {cfg.drift_factor} ids per "
            f"example; before it: median step {_ms(window['step_ms'])}, measured load per rank "
            f"{_ranks(window['per_rank'], ',.0f')} (max/mean {max_over_mean(window['per_rank']):.2f})")


def segment_notice(kind: str, restart: int, meta: Optional[dict], world: int, moves: dict) -> str:
    if kind == "restart":
        limit = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
        where = f"resuming from the checkpoint of step {meta['step']}" if meta else \
            "no committed checkpoint yet: starting again from step 0"
        head = f"[bold yellow]elastic restart {restart} of {limit}[/]: a worker failed and the group was restarted; {where}"
    else:
        head = f"[bold yellow]resumed[/] from the checkpoint of step {meta['step']}"
    if meta is None:
        return head
    head += f" on {world} ranks (saved on {meta['world']})"
    if not moves:
        return head + ": every table stays where it was"
    lines = [f"  {t}: {m['from']} -> {m['to']} ({m['why']})" for t, m in moves.items()]
    return head + f"; {len(moves)} tables placed anew:\n" + "\n".join(lines)


def _placement(v: dict) -> str:
    return f"{v['type']}{'' if v['ranks'] is None else v['ranks']}"


def reshard_notice(rec: dict) -> str:
    """The live reshard's decision: what moved, the per-rank measured load before and as predicted
    after, the planner's estimate (with the measured ids per bag) before and after, the measured
    step time before (the time after it is in the final figures) and the memory per rank."""
    step = rec["step"]
    if rec["status"] == "applied":
        moved = ", ".join(f"{t} -> {_placement(v)}" for t, v in rec["changes"].items())
        sent = rec["stats"].get("bytes_sent")
        size = f" ({sum(sent) / 2**20:.2f} MiB moved in {rec['stats'].get('wall_time_s', 0):.2f}s)" if sent else ""
        lines = [f"[bold green]live reshard at step {step}[/]: moved {len(rec['changes'])} tables: {moved}{size}"]
        before, after = rec["measured_before"], rec.get("predicted_after")
        lines.append(f"  measured load per rank (ids x dim per step), max/mean {max_over_mean(before):.2f}: "
                     f"{_ranks(before, ',.0f')}" + (f"; on the new plan {_ranks(after, ',.0f')} (max/mean "
                                                    f"{max_over_mean(after):.2f})" if after else ""))
        lines.append("  planner's estimate (measured ids per bag), slowest rank: "
                     f"{max(rec['estimated_before']) * 1e3:.3f} -> {max(rec['estimated_after']) * 1e3:.3f} ms per step")
        if rec.get("step_ms_before") is not None:
            first, last = rec.get("window_before", ["?", step])
            lines.append(f"  measured step time before: {_ms(rec['step_ms_before'])} (median of steps {first}-{last}; "
                         f"reported, not used to decide)")
        lines.append("  memory per rank (weights + optimizer state): " + "  ".join(
            f"{a / 2**20:.1f}->{b / 2**20:.1f} MiB" for a, b in zip(rec["memory_before"], rec["memory_after"])))
        if rec["reason"]:
            lines.append(f"  {rec['reason']}")
        return "\n".join(lines)
    if rec["status"] == "no-change":
        return f"[yellow]reshard check at step {step}: {rec['reason']}; plan kept[/]"
    return f"[bold red]reshard at step {step} failed:[/] {rec['reason']}"
