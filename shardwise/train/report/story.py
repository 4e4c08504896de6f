"""One run's story: its segments, the windows of measured load, the reshards.

A *segment* is a stretch of steps run by one process group: the first start, each ``--resume`` and
each elastic restart opens a new one (with its world size and the plan it began with). Within a
segment, *windows* of measured lookup load run from the segment's start or a reshard to the next
reshard or the segment's end, so no window mixes two layouts or two world sizes. The story is plain
JSON, saved in every checkpoint's meta, so a resumed run continues it.

Example:
    >>> s = new_story()
    >>> seg = open_segment(s, kind="start", world=2, step=0, plan={}, launch="a", attempt=0)
    >>> add_window(s, "whole segment", 0, 10, [3.0, 1.0])["max_over_mean"]
    1.5
    >>> close_segment(s, 10); run_counts(s)
    {'segments': 1, 'resumes': 0, 'restarts': 0}
"""

from __future__ import annotations

from typing import Optional

__all__ = ["new_story", "open_segment", "close_segment", "add_window", "add_reshard", "run_counts",
           "max_over_mean"]


def new_story() -> dict:
    return {"segments": [], "windows": [], "reshards": []}


def max_over_mean(per_rank: list) -> Optional[float]:
    """The imbalance of per-rank load (1.0 = even); None when nothing was measured."""
    mean = sum(per_rank) / len(per_rank) if per_rank else 0.0
    return max(per_rank) / mean if mean else None


def open_segment(story: dict, kind: str, world: int, step: int, plan: dict, launch: Optional[str],
                 attempt: int, moves: Optional[dict] = None, memory: Optional[list] = None,
                 estimated: Optional[list] = None, threads: Optional[int] = None) -> dict:
    """Start a segment (``kind``: ``start``, ``resume`` or ``restart``) at ``step``; ``plan`` is the
    plan JSON it begins with, ``moves`` what the resume placed anew and why."""
    seg = {"index": len(story["segments"]), "kind": kind, "world_size": world, "first_step": step,
           "last_step": step, "launch": launch, "attempt": attempt, "plan": plan, "moves": moves or {},
           "memory_per_rank": memory, "estimated_load_per_rank": estimated, "threads_per_process": threads}
    story["segments"].append(seg)
    return seg


def close_segment(story: dict, step: int) -> None:
    """Record that the current segment has run up to ``step`` (called at each save and at the end)."""
    story["segments"][-1]["last_step"] = step


def add_window(story: dict, label: str, first: int, last: int, per_rank: list, step_ms: Optional[float] = None) -> dict:
    """A window of measured load (ids x dim per rank per step) over steps ``first..last`` of the
    current segment; ``step_ms``: the median measured step time in it (reported, never decided on)."""
    w = {"segment": len(story["segments"]) - 1, "label": label, "first_step": first, "last_step": last,
         "steps": last - first, "per_rank": list(per_rank), "max_over_mean": max_over_mean(per_rank),
         "step_ms": step_ms}
    story["windows"].append(w)
    return w


def add_reshard(story: dict, record: dict) -> dict:
    rec = {"segment": len(story["segments"]) - 1, **record}
    story["reshards"].append(rec)
    return rec


def run_counts(story: dict) -> dict:
    """Segments, user resumes and elastic restarts so far. A restart is counted once however many
    segments its launch later opens: the launcher's restart number only grows within one launch."""
    restarts, prev = 0, None
    for seg in story["segments"]:
        same_launch = prev is not None and seg["launch"] is not None and seg["launch"] == prev["launch"]
        restarts += max(0, seg["attempt"] - (prev["attempt"] if same_launch else 0))
        prev = seg
    resumes = sum(1 for s in story["segments"] if s["kind"] == "resume")
    return {"segments": len(story["segments"]), "resumes": resumes, "restarts": restarts}
