"""The job's account of a run: the story in segments (``story``), the console (``progress``), and the
report folder -- metrics.json, plots, plan.md (``summary``).

Example:
    >>> from shardwise.train.report import max_over_mean
    >>> max_over_mean([1.0, 3.0])     # the measured load's imbalance over ranks (1.0 = even)
    1.5
"""

from .progress import Progress, console
from .story import add_reshard, add_window, close_segment, max_over_mean, new_story, open_segment, run_counts
from .summary import build_metrics, plan_markdown, plan_rows, print_plan, write_report

__all__ = ["Progress", "console", "new_story", "open_segment", "close_segment", "add_window", "add_reshard",
           "run_counts", "max_over_mean", "plan_rows", "print_plan", "plan_markdown", "build_metrics",
           "write_report"]
