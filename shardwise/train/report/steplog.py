"""The job's per-step log, kept on each rank and combined across ranks only when it is shown or saved.

Every step records its local loss and its predictions; every ``log_every`` steps (and before a
checkpoint, so a saved history is complete) one all-gather carries the losses of the steps since the
last flush and, at log steps, the window's scores and labels. Each step's global loss is then the
mean of the ranks' losses, summed in rank order in float64 (the losses are float32, so the sum is
exact and equals what a per-step all-reduce gave), and the window's AUC is taken over all ranks'
predictions. A per-step all-reduce of the loss was a collective and a point where the faster rank
waited for the slower one on every step; the log needs the numbers only when it shows them.

Example (inside a process group; every rank calls ``flush`` at the same steps)::

    log = StepLog(history)
    log.add(step, loss, logits, labels)
    if step % 10 == 0:
        last_loss, window_auc = log.flush(with_auc=True)
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
        k = len(self._steps)
        parts = [torch.cat(self._losses).to(torch.float64)] if k else []
        n = 0
        if with_auc and self._scores:
            scores, labels = torch.cat(self._scores), torch.cat(self._labels)
            n = scores.numel()
            parts += [scores.to(torch.float64), labels.to(torch.float64)]
        if not parts:
            return None, None
        mine = torch.cat(parts)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(every, mine, group=self.group)
        every = [t.cpu() for t in every]
        last = None
        if k:
            total = every[0][:k].clone()
            for t in every[1:]:   # rank order: the same float64 sum on every rank
                total += t[:k]
            means = (total / len(every)).tolist()
            self.history["step"].extend(self._steps)
            self.history["loss"].extend(means)
            last = means[-1]
        a = None
        if n:
            a = auc(torch.cat([t[k:k + n] for t in every]), torch.cat([t[k + n:] for t in every]))
            self.history["auc_step"].append(self._steps[-1] if k else self.history["step"][-1])
            self.history["auc"].append(a)
            self._scores, self._labels = [], []
        self._steps, self._losses = [], []
        return last, a

    def last_auc(self) -> Optional[float]:
        return self.history["auc"][-1] if self.history["auc"] else None
