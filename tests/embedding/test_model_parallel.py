"""DistributedModelParallel: a model with two embedding collections and a dense part trains like the
unsharded model on the global batch (mean of the per-rank losses) in one process."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from shardwise.embedding import (
    DistributedModelParallel, EmbeddingBagCollection, EmbeddingBagConfig, ShardedEmbeddingBagCollection,
    table_wise,
)
from shardwise.sparse import KeyedJaggedTensor
from shardwise.testing import run_on_ranks

from .workers import mesh_for

SGD = functools.partial(torch.optim.SGD, lr=0.1)


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = EmbeddingBagCollection([EmbeddingBagConfig(20, 4, "u", feature_names=["user"])], init_seed=1)
        self.items = EmbeddingBagCollection([EmbeddingBagConfig(30, 4, "i", feature_names=["item", "prev"]),
                                             EmbeddingBagConfig(6, 4, "c", feature_names=["cat"])], init_seed=2)
        torch.manual_seed(0)
        self.mlp = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, users: KeyedJaggedTensor, items: KeyedJaggedTensor):
        return self.mlp(torch.cat([self.users(users).values(), self.items(items).values()], dim=1)).squeeze(1)


def _batch(seed: int, n: int = 5):
    g = torch.Generator().manual_seed(seed)

    def kjt(keys, rows):
        lengths = torch.randint(0, 3, (len(keys) * n,), generator=g)
        values = torch.cat([torch.randint(0, r, (int(lengths[k * n:(k + 1) * n].sum()),), generator=g)
                            for k, r in enumerate(rows)])
        return KeyedJaggedTensor(keys, values, lengths=lengths)
    return kjt(["user"], [20]), kjt(["item", "prev", "cat"], [30, 30, 6]), torch.randn(n, generator=g)


def dmp_worker(rank, world, plan_kind):
    model = TwoTowers()
    ref = copy.deepcopy(model)
    plan = None if plan_kind == "planner" else {"users": {"u": table_wise(world - 1)},
                                                "items": {"i": table_wise(0), "c": table_wise(world - 1)}}
    dmp = DistributedModelParallel(model, plan=plan, mesh=mesh_for(world, 1), optimizer=SGD)
    dense_opt, ref_opt = SGD(dmp.parameters()), SGD(ref.parameters())
    for step in range(3):
        batches = [_batch(100 * step + r) for r in range(world)]
        u, i, y = batches[rank]
        dense_opt.zero_grad()
        ((dmp(u, i) - y) ** 2).mean().backward()
        dense_opt.step()
        ref_opt.zero_grad()
        (sum(((ref(bu, bi) - by) ** 2).mean() for bu, bi, by in batches) / world).backward()
        ref_opt.step()
    sharded = dmp.sharded_modules
    errs = []
    for path, name in (("users", "u"), ("items", "i"), ("items", "c")):
        full = sharded[path].state_dict()[f"embedding_bags.{name}.weight"].full_tensor()
        errs.append((full - getattr(ref, path).embedding_bags[name].weight).abs().max().item())
    inner = dmp.module
    errs.append(max((a - b).abs().max().item() for a, b in zip(inner.mlp.parameters(), ref.mlp.parameters())))
    return errs, sorted(sharded), all(isinstance(m, ShardedEmbeddingBagCollection) for m in sharded.values()), \
        sorted({k.split(".")[0] for k in dmp.fused_optimizer.params})


@pytest.mark.parametrize("world, plan_kind", [(2, "given"), (3, "planner")])
def test_dmp_trains_like_one_process_on_the_global_batch(world, plan_kind):
    for errs, paths, kinds, opts in run_on_ranks(dmp_worker, world, plan_kind, timeout=120.0):
        assert max(errs) < 1e-5, errs
        assert paths == ["items", "users"] == opts and kinds


def test_dmp_refuses_a_model_without_collections_and_bad_plans():
    with pytest.raises(ValueError, match="holds no EmbeddingBagCollection"):
        DistributedModelParallel(nn.Linear(2, 2))


def bad_plans(rank, world):
    errors = []
    for plan in ({"towers": {}}, ["x"]):
        try:
            DistributedModelParallel(TwoTowers(), plan=plan, mesh=mesh_for(world, 1))
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
    model = TwoTowers()
    model.items.embedding_bags["c"].half()      # the second collection mixes weight dtypes
    try:
        DistributedModelParallel(model, mesh=mesh_for(world, 1))
    except ValueError as exc:
        errors.append(str(exc))
    return errors, type(model.users).__name__   # the first collection is not replaced either


def test_dmp_bad_plans_raise_before_sharding():
    for errors, users in run_on_ranks(bad_plans, 2, timeout=60.0):
        assert "not embedding collections of the model" in errors[0] and "must be a dict" in errors[1]
        assert "collection 'items': the tables' weights have different dtypes" in errors[2], errors[2]
        assert users == "EmbeddingBagCollection"
