"""Steady-state throughput of the job: global examples per second over the training steps only.

Start-up steps (the first traces the compiled dense graph), the step that follows a live reshard
(it re-routes the prefetched batch on the new layout) and checkpoint steps are left out; evaluation
and the saves themselves run outside the timed steps. A timed step is the whole loop iteration a
training step takes: the pipelined step and, every ``log_every`` steps, the all-gather that gives
the logged steps their global mean losses and the window its AUC (report/steplog.py; started at the
log step and read at the next one).

``examples_per_s`` is the mean over the counted steps; ``block_examples_per_s`` the median over
blocks of ``BLOCK_STEPS`` consecutive counted steps of each block's mean (the statistic
``benchmarks/dlrm.py`` takes of the library step and of TorchRec's loops, so the job is compared like
with like, and one step that waited on the machine's other work moves neither side).

Example:
    >>> s = Steady(examples_per_step=512)
    >>> s.add(1, 0.9, "startup"); s.add(2, 0.01, None); s.add(3, 0.01, None)
    >>> s.summary()["examples_per_s"]
    51200.0
    >>> s.median_ms(1, 3)          # steps 2..3, the counted ones of a window from step 1 to step 3
    10.0
    >>> s.block_ms(block=2)        # one block of two counted steps
    10.0
"""

from __future__ import annotations

from typing import Optional

__all__ = ["Steady", "EXCLUDED_KINDS", "BLOCK_STEPS"]

EXCLUDED_KINDS = ("startup", "reshard", "checkpoint")
BLOCK_STEPS = 20   # benchmarks/dlrm.py times the library step in blocks of this many steps


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

    def block_ms(self, block: int = BLOCK_STEPS):
        """Median over blocks of ``block`` consecutive counted steps (in step order; a last, shorter
        block is left out) of each block's mean milliseconds per step; None before one full block."""
        xs = [self.times[k] for k in sorted(self.times)]
        means = sorted(sum(xs[i:i + block]) / block for i in range(0, len(xs) - block + 1, block))
        if not means:
            return None
        mid = len(means) // 2
        return 1e3 * (means[mid] if len(means) % 2 else (means[mid - 1] + means[mid]) / 2)

    def summary(self) -> dict:
        """JSON-ready: ``examples_per_s`` (None before any counted step), ``block_examples_per_s`` and
        ``block_ms`` (None before a full block of :data:`BLOCK_STEPS`), the steps and seconds counted
        and the steps left out, by reason."""
        rate = self.counted * self.examples_per_step / self.seconds if self.counted and self.seconds > 0 else None
        block = self.block_ms()
        return {"examples_per_s": rate, "block_examples_per_s": self.examples_per_step / block * 1e3 if block else None,
                "block_ms": block, "block_steps": BLOCK_STEPS, "steps_counted": self.counted,
                "seconds_counted": self.seconds, "examples_per_step": self.examples_per_step,
                "excluded_steps": self.excluded}
