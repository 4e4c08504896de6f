"""``shardwise train``: a DLRM-style click-through-rate job over local or multi-machine processes.

Example:
    >>> from shardwise.train import TrainConfig
    >>> TrainConfig(steps=50).batch_size
    256
"""

from .config import TrainConfig

__all__ = ["TrainConfig"]
