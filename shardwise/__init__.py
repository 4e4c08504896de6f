"""shardwise: shard PyTorch training across processes and machines."""

__version__ = "0.1.0"
__all__ = ["__version__"]
