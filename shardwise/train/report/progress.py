"""Rank 0's live view: a rich progress bar with loss, AUC and examples/s, plus notices above it.

Example:
    >>> with Progress(total=100, start=0, enabled=False) as p:
    ...     p.update(1, loss=0.69, auc=None, rate=1000.0)
"""

from __future__ import annotations

import math
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as _RichProgress

__all__ = ["Progress", "console"]

console = Console()


class Progress:
    """A no-op when ``enabled`` is False (ranks other than 0, ``--quiet``)."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.enabled = enabled
        self._bar = None
        if enabled:
            self._bar = _RichProgress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("AUC {task.fields[auc]}"),
                TextColumn("{task.fields[rate]} ex/s"), TimeElapsedColumn(), console=console,
                # rich redraws from a thread of rank 0's process, holding the GIL for each redraw
                # (17 ms measured on a loaded 2-core machine): twice a second, not rich's 10
                refresh_per_second=2)
            self._task = self._bar.add_task("train", total=total, completed=start, loss="-", auc="-", rate="-")

    def __enter__(self):
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, step: int, loss: float, auc: Optional[float], rate: float) -> None:
        if self._bar is None:
            return
        a = "-" if auc is None or math.isnan(auc) else f"{auc:.3f}"
        self._bar.update(self._task, completed=step, loss=f"{loss:.4f}", auc=a, rate=f"{rate:,.0f}")

    def notice(self, text: str) -> None:
        if self.enabled:
            console.print(text)
