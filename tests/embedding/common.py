"""Shared builders for embedding tests: small tables, random local batches, plans, ground truth."""

from __future__ import annotations

import copy
import functools

import torch

from shardwise.embedding import (
    EmbeddingBagCollection, EmbeddingBagConfig, column_wise, data_parallel, row_wise, table_row_wise,
    table_wise,
)
from shardwise.sparse import KeyedJaggedTensor

TABLES = [
    # (name, rows, dim, features, pooling): different dims share width buffers or not; t_tiny has
    # fewer rows than ranks so row-wise leaves some ranks an empty block.
    ("t_a", 11, 4, ("fa1", "fa2"), "sum"),
    ("t_b", 7, 6, ("fb",), "mean"),
    ("t_tiny", 3, 4, ("ftiny",), "sum"),
    ("t_c", 9, 5, ("fc1", "fc2"), "mean"),
]


def make_ebc(seed: int = 0, weighted: bool = False, device=None) -> EmbeddingBagCollection:
    cfgs = [EmbeddingBagConfig(name=n, num_embeddings=v, embedding_dim=d, feature_names=list(f), pooling=p) for n, v, d, f, p in TABLES]
    return EmbeddingBagCollection(cfgs, is_weighted=weighted, init_seed=seed, device=device)


def all_features() -> list[str]:
    return [f for _, _, _, fs, _ in TABLES for f in fs]


def make_batch(seed: int, batch: int, weighted: bool, drop=()) -> KeyedJaggedTensor:
    """Random bags (some empty); features in ``drop`` are absent; keys in a shuffled order."""
    g = torch.Generator().manual_seed(seed)
    rows = {f: v for _, v, _, fs, _ in TABLES for f in fs}
    keys = [f for f in all_features() if f not in drop]
    perm = torch.randperm(len(keys), generator=g).tolist()
    keys = [keys[i] for i in perm]
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    values = torch.cat([torch.randint(0, rows[k], (int(n),), generator=g)
                        for i, k in enumerate(keys) for n in lengths[i * batch:(i + 1) * batch]]
                       + [torch.zeros(0, dtype=torch.int64)])
    weights = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
    return KeyedJaggedTensor(keys, values, lengths=lengths, weights=weights, stride=batch)


def rank_batches(world: int, step: int, weighted: bool, seed: int = 0,
                 equal_batches: bool = False) -> list[KeyedJaggedTensor]:
    """Every rank's local batch for one step (different sizes and absent features per rank)."""
    out = []
    for r in range(world):
        drop = ("fb",) if (r + step) % 3 == 1 else ()
        size = 3 if equal_batches else 2 + (r + step) % 3
        out.append(make_batch(1000 * seed + 100 * step + r, size, weighted, drop))
    return out


def targets(world: int, step: int, batch_sizes, dim: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(77 + step)
    return [torch.randn(b, dim, generator=g) for b in batch_sizes[:world]]


def loss_fn(kt, target):
    return ((kt.values() - target) ** 2).sum()


def plans(world: int, mesh_hosts: int = 1) -> dict:
    """Named plans covering every sharding type alone and mixed."""
    names = [n for n, *_ in TABLES]
    out = {
        "table_wise": {n: table_wise(i % world) for i, n in enumerate(names)},
        "row_wise": {n: row_wise() for n in names},
        "column_wise": {n: column_wise(list(range(world))[i % 2:] or [0]) for i, n in enumerate(names)},
        "data_parallel": {n: data_parallel() for n in names},
        "table_row_wise": {n: table_row_wise(i % mesh_hosts) for i, n in enumerate(names)},
        "mixed": {names[0]: row_wise(), names[1]: table_wise(world - 1), names[2]: column_wise([world - 1, 0]),
                  names[3]: data_parallel()},
        "mixed2": {names[0]: column_wise([1, 0]), names[1]: row_wise(list(range(world))[::-1]),
                   names[2]: table_row_wise(mesh_hosts - 1), names[3]: table_wise(0)},
    }
    return out


def reference_train(ebc, optimizer, world: int, steps: int, weighted: bool, equal_batches: bool = False,
                    divided: bool = True):
    """The unsharded module trained on the global batch with a dense torch optimizer: on the mean of
    the per-rank losses (``divided``, what gradient division trains) or their sum."""
    ref = copy.deepcopy(ebc)
    opt = optimizer(ref.parameters())
    for step in range(steps):
        batches = rank_batches(world, step, weighted, equal_batches=equal_batches)
        tgts = targets(world, step, [b.stride() for b in batches], sum(d * len(f) for _, _, d, f, _ in TABLES))
        opt.zero_grad()
        loss = sum(loss_fn(ref(b), t) for b, t in zip(batches, tgts))
        (loss / world if divided else loss).backward()
        opt.step()
    return {n: ref.embedding_bags[n].weight.detach().clone() for n, *_ in TABLES}


SGD = functools.partial(torch.optim.SGD, lr=0.05)
ADAGRAD = functools.partial(torch.optim.Adagrad, lr=0.1)


def reference_train_touched_rows(ebc, optimizer, world: int, steps: int, weighted: bool):
    """torch.optim.Adam's own update applied to the rows the global batch touched (what a sparse,
    fused Adam does; mean of the per-rank losses): the rows are gathered into a parameter whose state
    is the rows' state."""
    ref = copy.deepcopy(ebc)
    table_of = {f: n for n, _, _, fs, _ in TABLES for f in fs}
    state = {n: {} for n, *_ in TABLES}
    for step in range(steps):
        batches = rank_batches(world, step, weighted)
        tgts = targets(world, step, [b.stride() for b in batches], sum(d * len(f) for _, _, d, f, _ in TABLES))
        ref.zero_grad()
        (sum(loss_fn(ref(b), t) for b, t in zip(batches, tgts)) / world).backward()
        for name, *_ in TABLES:
            ids = [b[f].values() for b in batches for f in b.keys() if table_of[f] == name]
            rows = torch.unique(torch.cat(ids)) if ids else torch.zeros(0, dtype=torch.int64)
            weight = ref.embedding_bags[name].weight
            piece = torch.nn.Parameter(weight.detach()[rows].clone())
            opt = optimizer([piece])
            full = state[name]
            if full:
                opt.state[piece] = {"step": torch.tensor(float(full["step"])),
                                    **{k: v[rows].clone() for k, v in full.items() if k != "step"}}
            piece.grad = weight.grad[rows].clone()
            opt.step()
            with torch.no_grad():
                weight[rows] = piece.detach()
            new = opt.state[piece]
            if not full:
                full.update({k: torch.zeros_like(weight) for k in new if k != "step"})
            for k, v in new.items():
                if k == "step":
                    full["step"] = int(v.item())
                else:
                    full[k][rows] = v
    return {n: ref.embedding_bags[n].weight.detach().clone() for n, *_ in TABLES}


ADAM = functools.partial(torch.optim.Adam, lr=0.05)
