"""Checkpoints of sharded collections that load into another world size and another plan.

A save writes every shard of the weights and of every optimizer-state buffer as a chunk with its
global offsets (torch.distributed.checkpoint). A load asks, for each of the new module's own boxes,
for the saved chunks that overlap it -- the same box-overlap planning as a live reshard, done by
DCP's planner over the chunk lists -- so world size, sharding types and shard counts may all differ.
The module is checked against the checkpoint's metadata (tables, shapes, optimizer state names)
before anything is read into it.

Example:
    >>> import functools, tempfile, torch
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, row_wise, table_wise
    >>> tables, opt = [EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])], functools.partial(torch.optim.Adagrad, lr=0.1)
    >>> sharded = shard(EmbeddingBagCollection(tables), {"t0": table_wise(0)}, optimizer=opt)
    >>> other = shard(EmbeddingBagCollection(tables, init_seed=1), {"t0": row_wise()}, optimizer=opt)  # another plan
    >>> with tempfile.TemporaryDirectory() as ckpt:
    ...     save_sharded(ckpt, sharded)
    ...     load_sharded(ckpt, other)
    >>> w = lambda m: m.state_dict()["embedding_bags.t0.weight"].full_tensor()
    >>> torch.equal(w(other), w(sharded))
    True
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

__all__ = ["save_sharded", "load_sharded", "checkpoint_state", "with_legacy_names"]

# Fused-optimizer state names before they followed TorchRec's (``<t>.momentum1`` ...): checkpoints
# written then still load, the old entries read into the new ones.
_OLDER = {"momentum1": ("sum", "exp_avg"), "momentum2": ("exp_avg_sq",), "step": ("step",)}


def checkpoint_state(module) -> dict:
    """``{"model": ..., "optim": ...}``: views of the live shards, as DCP saves and loads them."""
    return {"model": module.state_dict(), "optim": module.fused_optimizer.state_dict()}


def save_sharded(path, module) -> None:
    """Collective: save ``module``'s weights and fused-optimizer state (every buffer and the step).

    Example:
        >>> import tempfile; from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, row_wise
        >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])]), {"t0": row_wise()})
        >>> with tempfile.TemporaryDirectory() as path: save_sharded(path, sharded)   # every rank, the same path
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


def with_legacy_names(state: dict, saved_keys, prefix: str = "") -> dict:
    """``state`` (nested dicts of tensors, as DCP loads) with each fused-optimizer entry that the
    checkpoint lacks (``...<t>.momentum1``) renamed to its older name where the checkpoint has that
    (``...sum``); the tensors are the same objects, so loading the result fills ``state``.

    Example:
        >>> import torch
        >>> osd = {"state": {"embedding_bags.t.weight": {"t.momentum1": torch.zeros(2)}}}
        >>> with_legacy_names(osd, {"state.embedding_bags.t.weight.sum"})
        {'state': {'embedding_bags.t.weight': {'sum': tensor([0., 0.])}}}
    """
    saved = set(saved_keys)
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out[k] = with_legacy_names(v, saved, key + ".")
            continue
        name = k
        if key not in saved and "." in k:
            for old in _OLDER.get(k.rsplit(".", 1)[1], ()):
                if f"{prefix}{old}" in saved:
                    name = old
                    break
        out[name] = v
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
        >>> import tempfile; from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, row_wise
        >>> small, wide = (shard(EmbeddingBagCollection([EmbeddingBagConfig(10, d, "t0", feature_names=["f"])]),
        ...                      {"t0": row_wise()}) for d in (4, 5))
        >>> with tempfile.TemporaryDirectory() as path:
        ...     save_sharded(path, small)
        ...     load_sharded(path, wide)
        Traceback (most recent call last):
        ValueError: checkpoint '...' does not fit this module: missing [], shape mismatches ['model.embedding_bags.t0.weight: saved (10, 4), module (10, 5)']; ...
    """
    reader = dcp.FileSystemReader(os.fspath(path))
    state = checkpoint_state(module)
    metadata = reader.read_metadata()
    mapped = with_legacy_names(state, metadata.state_dict_metadata)
    _check_against(metadata, mapped, path)
    dcp.load(mapped, checkpoint_id=os.fspath(path))
    # the step counts live in the optimizer state; this also sets them in every store
    module.fused_optimizer.load_state_dict(state["optim"])
