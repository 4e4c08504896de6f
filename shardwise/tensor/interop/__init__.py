"""Where shardwise's DTensor meets other systems: PyTorch's own DTensor (``torch_dtensor``) and
``torch.distributed.checkpoint``'s protocol (``checkpoint``)."""

from .torch_dtensor import from_torch, to_torch

__all__ = ["from_torch", "to_torch"]
