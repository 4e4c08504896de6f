"""Where shardwise's DTensor meets other systems: PyTorch's own DTensor (``torch_dtensor``) and
``torch.distributed.checkpoint``'s protocol (``checkpoint``).

Example:
    >>> import torch; from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
    >>> from shardwise.tensor.interop import from_torch, to_torch
    >>> x = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
    >>> t = to_torch(x); isinstance(t, torch.distributed.tensor.DTensor), t.placements   # PyTorch's, same data
    (True, (Shard(dim=0),))
    >>> from_torch(t).to_local().data_ptr() == x.to_local().data_ptr()
    True
"""

from .torch_dtensor import from_torch, to_torch

__all__ = ["from_torch", "to_torch"]
