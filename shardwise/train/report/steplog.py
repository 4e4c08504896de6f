"""The job's per-step log, kept on each rank and combined across ranks only when it is shown or saved.

Every step records its local loss and its predictions; every ``log_every`` steps (and before a
checkpoint, so a saved history is complete) one all-gather carries the losses of the steps since the
last flush and, at log steps, the window's scores and labels. Each step's global loss is then the
mean of the ranks' losses, summed in rank order in float64 (the losses are float32, so the sum is
exact and equals what a per-step all-reduce gave), and the window's AUC is taken over all ranks'
predictions. A per-step all-reduce of the loss was a collective and a point where the faster rank
waited for the slower one on every step; the log needs the numbers only when it shows them.

The all-gather can also run in the background: :meth:`start` launches it and returns at once,
:meth:`collect` (a step later, or before the next flush) waits for it and writes the history, so the
log step is not a point where the faster rank waits for the slower one. The numbers are the same.

Example (inside a process group; every rank calls ``flush``/``start``/``collect`` at the same steps)::

    log = StepLog(history)
    log.add(step, loss, logits, labels)
    if step % 10 == 0:
        last_loss, window_auc = log.flush(with_auc=True)   # or log.start(True); ...; log.collect()
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ..model import auc

__all__ = ["StepLog"]


class StepLog:
    """Appends ``step`` and the global mean ``loss`` of every step to ``history`` (and ``auc_step``,
    ``auc`` at AUC flushes), in step order, at each :meth:`flush`."""

    def __init__(self, history: dict, group=None):
        self.history, self.group = history, group
        self._steps: list = []
        self._losses: list = []
        self._scores: list = []
        self._labels: list = []
        self._flight = None   # (work, sent, received, steps, #losses, #scores) of a started all-gather

    def add(self, step: int, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Record one step locally (no collective; tensors are kept, not synchronised)."""
        self._steps.append(step)
        self._losses.append(loss.detach().reshape(1))
        self._scores.append(torch.sigmoid(logits.detach()))
        self._labels.append(labels.detach())

    @property
    def pending(self) -> int:
        """Steps recorded since the last flush."""
        return len(self._steps)

    def flush(self, with_auc: bool) -> tuple:
        """Collective (every rank at the same step, with the same ``with_auc``): the losses recorded
        since the last flush go into the history; with ``with_auc`` also the AUC of the predictions
        since the last AUC flush. Returns (the last step's global loss or None, the AUC or None)."""
        self.start(with_auc)
        return self.collect()

    @property
    def in_flight(self) -> bool:
        """A :meth:`start` whose numbers :meth:`collect` has not taken yet."""
        return self._flight is not None

    def start(self, with_auc: bool) -> None:
        """Collective: :meth:`flush` without waiting; the all-gather runs in the background until
        :meth:`collect` (an earlier one still in flight is collected first)."""
        if self._flight is not None:
            self.collect()
        k = len(self._steps)
        parts = [torch.cat(self._losses).to(torch.float64)] if k else []
        n = 0
        if with_auc and self._scores:
            scores, labels = torch.cat(self._scores), torch.cat(self._labels)
            n = scores.numel()
            parts += [scores.to(torch.float64), labels.to(torch.float64)]
            self._scores, self._labels = [], []
        if not parts:
            return
        mine = torch.cat(parts)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        work = dist.all_gather(every, mine, group=self.group, async_op=True)
        # the steps' record leaves the lists now: steps added before collect() belong to the next flush
        self._flight = (work, mine, every, self._steps, k, n)
        self._steps, self._losses = [], []

    def collect(self) -> tuple:
        """Wait for the all-gather :meth:`start` launched and write its numbers into the history.
        Returns (the last flushed step's global loss or None, the AUC or None); (None, None) when
        nothing is in flight."""
        if self._flight is None:
            return None, None
        work, _, every, steps, k, n = self._flight
        self._flight = None
        work.wait()
        every = [t.cpu() for t in every]
        last = None
        if k:
            total = every[0][:k].clone()
            for t in every[1:]:   # rank order: the same float64 sum on every rank
                total += t[:k]
            means = (total / len(every)).tolist()
            self.history["step"].extend(steps)
            self.history["loss"].extend(means)
            last = means[-1]
        a = None
        if n:
            a = auc(torch.cat([t[k:k + n] for t in every]), torch.cat([t[k + n:] for t in every]))
            self.history["auc_step"].append(steps[-1] if k else self.history["step"][-1])
            self.history["auc"].append(a)
        return last, a

    def last_auc(self) -> Optional[float]:
        return self.history["auc"][-1] if self.history["auc"] else None
