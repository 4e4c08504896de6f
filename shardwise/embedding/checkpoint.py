"""Checkpoints of sharded collections that load into another world size and another plan.

A save writes every shard of the weights and of every optimizer-state buffer as a chunk with its
global offsets (torch.distributed.checkpoint). A load asks, for each of the new module's own boxes,
for the saved chunks that overlap it -- the same box-overlap planning as a live reshard, done by
DCP's planner over the chunk lists -- so world size, sharding types and shard counts may all differ.
The module is checked against the checkpoint's metadata (tables, shapes, optimizer state names)
before anything is read into it.

Example:
    >>> save_sharded("ckpt/step100", sharded)                  # world 4, table-wise  # doctest: +SKIP
    >>> other = shard(ebc, {"t0": row_wise()}, optimizer=opt)  # world 2, row-wise    # doctest: +SKIP
    >>> load_sharded("ckpt/step100", other)                                          # doctest: +SKIP
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

__all__ = ["save_sharded", "load_sharded", "checkpoint_state"]


def checkpoint_state(module) -> dict:
    """``{"model": ..., "optim": ...}``: views of the live shards, as DCP saves and loads them."""
    return {"model": module.state_dict(), "optim": module.fused_optimizer.state_dict()}


def save_sharded(path, module) -> None:
    """Collective: save ``module``'s weights and fused-optimizer state (every buffer and the step).

    Example:
        >>> save_sharded("/ckpt/run1", sharded)                # doctest: +SKIP
    """
    dcp.save(checkpoint_state(module), checkpoint_id=os.fspath(path))


def _tensor_entries(state: dict, prefix: str = "") -> dict:
    """Flattened ``{"model.embedding_bags.t.weight": tensor, "optim.state.<key>.<name>": tensor}``."""
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_tensor_entries(v, key + "."))
        elif isinstance(v, torch.Tensor):
            out[key] = v
    return out


def _check_against(metadata, state: dict, path) -> None:
    """Every tensor the module needs is in the checkpoint with the same global shape."""
    saved = metadata.state_dict_metadata
    missing, wrong = [], []
    for key, t in _tensor_entries(state).items():
        if key.startswith("optim.param_groups"):
            continue
        md = saved.get(key)
        if md is None:
            missing.append(key)
        elif isinstance(md, TensorStorageMetadata) and tuple(md.size) != tuple(t.shape):
            wrong.append(f"{key}: saved {tuple(md.size)}, module {tuple(t.shape)}")
    if missing or wrong:
        raise ValueError(f"checkpoint {os.fspath(path)!r} does not fit this module: missing {missing}, "
                         f"shape mismatches {wrong}; load it into a collection with the same tables and the "
                         f"same optimizer type (any plan and world size)")


def load_sharded(path, module) -> None:
    """Collective: load a :func:`save_sharded` checkpoint into ``module`` -- any world size, any plan.

    Weights and optimizer state arrive bit-exact wherever the new shards put them. Raises ValueError
    (on every rank, before reading anything in) if the checkpoint lacks a table, a state buffer of the
    module's optimizer, or has another table shape.

    Example:
        >>> load_sharded("/ckpt/run1", resharded_on_two_ranks)   # doctest: +SKIP
    """
    reader = dcp.FileSystemReader(os.fspath(path))
    state = checkpoint_state(module)
    _check_against(reader.read_metadata(), state, path)
    dcp.load(state, checkpoint_id=os.fspath(path))
    # the step counts live in the optimizer state; this also sets them in every store
    module.fused_optimizer.load_state_dict(state["optim"])
