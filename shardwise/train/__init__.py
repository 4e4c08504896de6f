"""``shardwise train``: a DLRM-style click-through-rate job over local or multi-machine processes.

Example:
    >>> from shardwise.train import TrainConfig
    >>> TrainConfig(steps=50).batch_size
    256
"""

from .config import TrainConfig


def __getattr__(name):
    # the pipeline imports torch.distributed and the embedding package: only on demand
    if name in ("TrainPipeline", "TrainPipelineSparseDist"):
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TrainConfig", "TrainPipeline", "TrainPipelineSparseDist"]
