"""shardwise: shard PyTorch training across processes and machines."""

# registers the at-exit release of destroyed process groups (see _exit.py: without it, a rank that
# used shardwise could abort at exit after destroy_process_group)
from . import _exit as _exit  # noqa: F401

__version__ = "0.1.0"
__all__ = ["__version__"]
