"""Compile-mode parallel training: trace forward, backward and optimizer step as one graph.

Example (each rank passes its own batch; the mesh defaults to every rank of the default group)::

    from shardwise.compile import DataParallel, compile

    @compile(parallel_mode=DataParallel("fully_shard"))
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
