"""Shared builders for EmbeddingCollection tests: tables of one dim, random local batches (duplicate
ids, empty bags, absent features), plans, and the unsharded module trained in plain PyTorch."""

from __future__ import annotations

import copy
import functools

import torch

from shardwise.embedding import (
    EmbeddingCollection, EmbeddingConfig, RowWiseAdagrad, column_wise, data_parallel, row_wise, table_row_wise,
    table_wise,
)
from shardwise.sparse import KeyedJaggedTensor

DIM = 6
TABLES = [
    # (name, rows, features): s_tiny has fewer rows than ranks, so row-wise leaves a rank an empty block
    ("s_a", 11, ("sa1", "sa2")),
    ("s_b", 7, ("sb",)),
    ("s_tiny", 2, ("stiny",)),
    ("s_c", 9, ("sc",)),
]
NAMES = [n for n, *_ in TABLES]
FEATURES = [f for _, _, fs in TABLES for f in fs]
SGD = functools.partial(torch.optim.SGD, lr=0.05)
ADAGRAD = functools.partial(torch.optim.Adagrad, lr=0.1)
ROWWISE = functools.partial(RowWiseAdagrad, lr=0.1)


def make_ec(seed: int = 0, device=None) -> EmbeddingCollection:
    cfgs = [EmbeddingConfig(rows, DIM, name, feature_names=list(fs)) for name, rows, fs in TABLES]
    return EmbeddingCollection(cfgs, device=device, init_seed=seed)


def make_batch(seed: int, batch: int, drop=(), weighted: bool = False) -> KeyedJaggedTensor:
    """Random bags (some empty, repeated ids likely); features in ``drop`` absent; keys shuffled."""
    g = torch.Generator().manual_seed(seed)
    rows = {f: v for _, v, fs in TABLES for f in fs}
    keys = [f for f in FEATURES if f not in drop]
    keys = [keys[i] for i in torch.randperm(len(keys), generator=g).tolist()]
    lengths = torch.randint(0, 5, (len(keys) * batch,), generator=g)
    values = torch.cat([torch.randint(0, rows[k], (int(n),), generator=g)
                        for i, k in enumerate(keys) for n in lengths[i * batch:(i + 1) * batch]]
                       + [torch.zeros(0, dtype=torch.int64)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None   # ignored, as in TorchRec
    return KeyedJaggedTensor(keys, values, weights=weights, lengths=lengths, stride=batch)


def rank_batches(world: int, step: int, seed: int = 0) -> list[KeyedJaggedTensor]:
    """Every rank's local batch for one step: batch sizes differ per rank, a feature goes missing."""
    out = []
    for r in range(world):
        drop = ("sb",) if (r + step) % 3 == 1 else ()
        out.append(make_batch(1000 * seed + 100 * step + r, 2 + (r + step) % 3, drop, weighted=(r + step) % 2 == 0))
    return out


def loss_fn(out: dict, step: int, rank: int) -> torch.Tensor:
    """Squared error of every row against a fixed random target: sensitive to each row's position."""
    values = torch.cat([out[f].values() for f in FEATURES])
    g = torch.Generator().manual_seed(7919 * step + rank)
    target = torch.randn(values.shape[0], DIM, generator=g).to(values.device, values.dtype)
    return ((values - target) ** 2).sum()


def plans(world: int, hosts: int = 1) -> dict:
    """Every sharding type alone and mixed; column_wise mixes a split over all ranks with one over
    a subset (so column blocks of different tables do not line up)."""
    ranks = list(range(world))
    return {
        "table_wise": {n: table_wise(i % world) for i, n in enumerate(NAMES)},
        "row_wise": {n: row_wise() for n in NAMES},
        "column_wise": {n: column_wise(ranks[i % 2:] or [0]) for i, n in enumerate(NAMES)},
        "data_parallel": {n: data_parallel() for n in NAMES},
        "table_row_wise": {n: table_row_wise(i % hosts) for i, n in enumerate(NAMES)},
        "mixed": {"s_a": row_wise(), "s_b": table_wise(world - 1), "s_tiny": column_wise([world - 1, 0]),
                  "s_c": data_parallel()},
        "mixed2": {"s_a": column_wise([1, 0]), "s_b": row_wise(ranks[::-1]), "s_tiny": data_parallel(),
                   "s_c": table_wise(0)},
    }


def reference_train(ec, optimizer, world: int, steps: int, divided: bool = True, seed: int = 0) -> dict:
    """The unsharded module (F.embedding, dense torch optimizer) trained on the global batch: the mean
    of the per-rank losses (``divided``, what gradient division trains) or their sum."""
    ref = copy.deepcopy(ec)
    opt = optimizer(ref.parameters())
    for step in range(steps):
        opt.zero_grad()
        loss = sum(loss_fn(ref(b), step, r) for r, b in enumerate(rank_batches(world, step, seed)))
        (loss / world if divided else loss).backward()
        opt.step()
    return {f"embeddings.{n}.weight": ref.embeddings[n].weight.detach().clone() for n in NAMES}


def train(sharded, rank: int, world: int, steps: int, first: int = 0, seed: int = 0) -> None:
    for step in range(first, first + steps):
        loss_fn(sharded(rank_batches(world, step, seed)[rank]), step, rank).backward()


def full_weights(sharded) -> dict:
    return {k: v.full_tensor() for k, v in sharded.state_dict().items()}


def max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
