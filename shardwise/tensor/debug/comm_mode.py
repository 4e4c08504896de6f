"""``CommDebugMode`` that sees the collectives shardwise's DTensor runs.

PyTorch's ``torch.distributed.tensor.debug.CommDebugMode`` is a dispatch mode. A mode runs before a
tensor subclass, and while it handles an op it is switched off, so the collectives a subclass issues
inside its own ``__torch_dispatch__`` would not be seen; PyTorch's mode therefore answers
``NotImplemented`` for ops on *its* DTensor, which lets the subclass run first with the mode still
active. This class does the same for shardwise's DTensor and otherwise is PyTorch's mode: the same
counts, keyed the same way (``torch.ops.c10d_functional.all_reduce``, ...), module tables included.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor.debug import CommDebugMode as _TorchCommDebugMode

__all__ = ["CommDebugMode"]


class CommDebugMode(_TorchCommDebugMode):
    """Counts every collective issued inside the block: by shardwise's op dispatch, ``redistribute``,
    ``full_tensor``, ``distribute_tensor`` and direct ``torch.distributed`` calls (PyTorch's DTensor too).

    >>> from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    >>> mesh = init_device_mesh("cpu", (1,)); x = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
    >>> comm_mode = CommDebugMode()
    >>> with comm_mode:
    ...     y = x.redistribute(mesh, [Replicate()])
    >>> comm_mode.get_comm_counts()[torch.ops.c10d_functional.all_gather_into_tensor]  # 1 on 2 ranks
    0
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from ..dtensor import DTensor

        if DTensor in types and not isinstance(func, torch._ops.HigherOrderOperator):
            self._record_dtensor_op(func, args)
            return NotImplemented  # shardwise's DTensor runs, with this mode still active
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _record_dtensor_op(self, func, args) -> None:
        # the entry PyTorch's mode keeps for an op on its DTensor (shown by the tracing tables)
        tracker = self.advanced_module_tracker
        ops = self.comm_module_operation_counts.setdefault(tracker.name, {"operations_list": []})
        from ..dtensor import DTensor

        dts = [a for a in args if isinstance(a, DTensor)]
        ops["operations_list"].append({
            "name": func, "input_shape": [a.shape for a in dts], "input_sharding": [a.placements for a in dts],
            "device_mesh": str(dts[-1].device_mesh) if dts else "", "is_bw": tracker.is_bw,
            "is_activation_checkpointing": tracker.activation_checkpointing,
        })
