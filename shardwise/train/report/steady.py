"""Steady-state throughput of the job: global examples per second over the training steps only.

Start-up steps (the first traces the compiled dense graph), the step that follows a live reshard
(it re-routes the prefetched batch on the new layout) and checkpoint steps are left out; evaluation
and the saves themselves run outside the timed steps. A timed step is the whole loop iteration a
training step takes: the pipelined step and, every ``log_every`` steps, the all-gather that gives
the logged steps their global mean losses and the window its AUC (report/steplog.py; started at the
log step and read at the next one).

Example:
    >>> s = Steady(examples_per_step=512)
    >>> s.add(1, 0.9, "startup"); s.add(2, 0.01, None); s.add(3, 0.01, None)
    >>> s.summary()["examples_per_s"]
    51200.0
    >>> s.median_ms(1, 3)          # steps 2..3, the counted ones of a window from step 1 to step 3
    10.0
"""

from __future__ import annotations

from typing import Optional

__all__ = ["Steady", "EXCLUDED_KINDS"]

EXCLUDED_KINDS = ("startup", "reshard", "checkpoint")


class Steady:
    """Collects each step's wall time, counted or excluded (and why)."""

    def __init__(self, examples_per_step: int):
        self.examples_per_step = int(examples_per_step)
        self.seconds, self.counted = 0.0, 0
        self.excluded: dict = {k: [] for k in EXCLUDED_KINDS}
        self.times: dict = {}   # step -> seconds, counted steps only

    def add(self, step: int, seconds: float, excluded: Optional[str]) -> None:
        """Step ``step`` took ``seconds``; ``excluded`` is None or one of :data:`EXCLUDED_KINDS`."""
        if excluded is None:
            self.seconds += seconds
            self.counted += 1
            self.times[step] = seconds
        else:
            self.excluded[excluded].append(step)

    def median_ms(self, first: int, last: int):
        """Median milliseconds of the counted steps ``first+1 .. last`` (a window of measured load runs
        from the step count ``first`` to ``last``); None when none was counted. The median, so one step
        that waited on the machine's other work does not move it."""
        xs = sorted(v for k, v in self.times.items() if first < k <= last)
        if not xs:
            return None
        mid = len(xs) // 2
        return 1e3 * (xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2)

    def summary(self) -> dict:
        """JSON-ready: ``examples_per_s`` (None before any counted step), the steps and seconds counted
        and the steps left out, by reason."""
        rate = self.counted * self.examples_per_step / self.seconds if self.counted and self.seconds > 0 else None
        return {"examples_per_s": rate, "steps_counted": self.counted, "seconds_counted": self.seconds,
                "examples_per_step": self.examples_per_step, "excluded_steps": self.excluded}
