"""SGD on gradients averaged over ranks first: the data-parallel dense part of the pipeline tests."""

from __future__ import annotations

import torch
import torch.distributed as dist


class SyncSGD(torch.optim.SGD):
    """SGD on gradients averaged over ranks (the dense part is data parallel)."""

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        return super().step(closure)
