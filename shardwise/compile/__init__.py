"""Compile-mode parallel training: trace forward, backward and optimizer step as one graph.

Example (each rank passes its own batch; the mesh defaults to every rank of the default group):

    >>> import copy, torch
    >>> from shardwise.compile import DataParallel, collective_summary, compile
    >>> @compile(parallel_mode=DataParallel("fully_shard"))
    ... def step(model, optimizer, x, y):
    ...     loss = torch.nn.functional.mse_loss(model(x), y)
    ...     loss.backward()
    ...     optimizer.step()
    ...     optimizer.zero_grad()
    ...     return loss
    >>> model = torch.nn.Linear(4, 2); ref = copy.deepcopy(model)
    >>> x, y = torch.randn(8, 4), torch.randn(8, 2)
    >>> loss = step(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y)
    >>> torch.allclose(loss, torch.nn.functional.mse_loss(ref(x), y))
    True
    >>> collective_summary(step.graph)      # {kind: (count, bytes per rank)}: parameters in, gradients out
    {'all_gather': (1, 40), 'reduce_scatter': (1, 40)}
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
