"""Training with DTensor parameters equals single-process training (Megatron-style MLP, optimizers)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 9), nn.Tanh(), nn.Linear(9, 5))


def _distribute_mlp(model, mesh):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    layout = {"0.weight": Shard(0), "0.bias": Shard(0), "2.weight": Shard(1), "2.bias": Replicate(),
              "4.weight": Replicate(), "4.bias": Replicate()}
    for name, param in list(model.named_parameters()):
        mod_name, attr = name.rsplit(".", 1)
        mod = model.get_submodule(mod_name)
        setattr(mod, attr, nn.Parameter(distribute_tensor(param.detach(), mesh, [layout[name]])))


def _optimizer(kind, params, foreach):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1, foreach=foreach)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.05, foreach=foreach)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=foreach)


def _train(model, opt, x, y, steps):
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss)
    return losses


def train_megatron(rank, world, kind, foreach, steps):
    from shardwise.tensor import Replicate, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)
    ref = _mlp()
    ref_losses = _train(ref, _optimizer(kind, ref.parameters(), foreach), x, y, steps)
    model = _mlp()
    _distribute_mlp(model, mesh)
    dx, dy = distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(y, mesh, [Replicate()])
    losses = _train(model, _optimizer(kind, model.parameters(), foreach), dx, dy, steps)
    err = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    loss_err = max(abs(a.full_tensor().item() - b.item()) for a, b in zip(losses, ref_losses))
    placements = [str(p.placements[0]) for p in model.parameters()]
    return err, loss_err, placements


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind,foreach", [("adamw", False), ("adamw", True), ("adam", True), ("sgd", False)])
def test_megatron_mlp_trains_like_single_process(world, kind, foreach):
    for err, loss_err, placements in run_on_ranks(train_megatron, world, kind, foreach, 5):
        assert err < 1e-5 and loss_err < 1e-5, (err, loss_err)
        assert placements == ["S(0)", "S(0)", "S(1)", "R", "R", "R"]


def batch_sharded(rank, world):
    """Data parallel through DTensor: batch Shard(0), replicated weights; gradients are reduced."""
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(10, 12, generator=g), torch.randint(0, 5, (10,), generator=g)
    ref = _mlp()
    _train(ref, _optimizer("adam", ref.parameters(), True), x, y, 3)
    model = _mlp()
    for mod in model:
        for attr, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, attr, nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()])))
    dx, dy = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(y, mesh, [Shard(0)])
    _train(model, _optimizer("adam", model.parameters(), True), dx, dy, 3)
    return max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def test_batch_sharded_inputs_with_uneven_batch():
    for err in run_on_ranks(batch_sharded, 3):
        assert err < 1e-5


def low_precision(rank, world):
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        a, b = torch.randn(6, 4).to(dtype), torch.randn(4, 3).to(dtype)
        da, db = distribute_tensor(a, mesh, [Shard(0)]), distribute_tensor(b, mesh, [Shard(1)])
        got = (torch.relu(da) @ db).full_tensor()
        out[str(dtype)] = (got.dtype == dtype, (got.float() - (torch.relu(a) @ b).float()).abs().max().item())
    return out


def test_low_precision_ops():
    for res in run_on_ranks(low_precision, 2):
        for dtype, (same_dtype, err) in res.items():
            assert same_dtype and err < 1e-2, (dtype, err)


def clip_and_norms(rank, world):
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    ref = _mlp()
    model = _mlp()
    _distribute_mlp(model, mesh)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)
    from shardwise.tensor import Replicate

    dx, dy = distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(y, mesh, [Replicate()])
    F.cross_entropy(ref(x), y).backward()
    F.cross_entropy(model(dx), dy).backward()
    out = {}
    for foreach in (False, True):
        for p in (2.0, 1.0, float("inf")):
            ours = torch.nn.utils.get_total_norm([q.grad for q in model.parameters()], p, foreach=foreach)
            theirs = torch.nn.utils.get_total_norm([q.grad for q in ref.parameters()], p, foreach=foreach)
            out[(foreach, p)] = abs(ours.full_tensor().item() - theirs.item())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, foreach=True)
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    out["clipped"] = max((a.grad.full_tensor() - b.grad).abs().max().item()
                         for a, b in zip(model.parameters(), ref.parameters()))
    z = torch.arange(10.0)
    out["uneven"] = abs(torch.linalg.vector_norm(distribute_tensor(z, mesh, [Shard(0)])).full_tensor().item()
                        - torch.linalg.vector_norm(z).item())
    return out


def test_gradient_norms_and_clipping_on_sharded_grads():
    for res in run_on_ranks(clip_and_norms, 4):
        assert max(res.values()) < 1e-5, res
