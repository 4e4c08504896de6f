"""Compile-mode parallel training: trace forward, backward and optimizer step as one graph.

Example::

    from torch.distributed.device_mesh import init_device_mesh
    from shardwise.compile import DataParallel, compile

    mesh = init_device_mesh("cpu", (2,))

    @compile(parallel_mode=DataParallel(mesh, style="fully_shard"))
    def step(model, optimizer, x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss
"""
from .api import CompiledStep, compile
from .data_parallel import DataParallel
from .expand import DTensorExpandMode
from .modes import ParallelMode, Signature
from .summary import collective_summary, format_graph

__all__ = [
    "compile",
    "CompiledStep",
    "ParallelMode",
    "Signature",
    "DataParallel",
    "DTensorExpandMode",
    "collective_summary",
    "format_graph",
]
