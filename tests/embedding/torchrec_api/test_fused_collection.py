"""FusedEmbeddingBagCollection: one process, no process group; the optimizer applied in backward equals
the plain unsharded collection trained with the torch optimizer."""

import functools

import pytest
import torch

from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, RowWiseAdagrad
from shardwise.embedding.torchrec_api.fused_collection import FusedEmbeddingBagCollection
from shardwise.sparse import KeyedJaggedTensor

TABLES = [EmbeddingBagConfig(12, 4, "t_sum", feature_names=["a", "b"]),
          EmbeddingBagConfig(7, 3, "t_mean", feature_names=["c"], pooling="mean")]


def _batch(step: int, weighted: bool) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (3 * 5,), generator=g)
    rows = [12] * 10 + [7] * 5
    values = torch.cat([torch.randint(0, r, (int(n),), generator=g) for r, n in zip(rows, lengths)])
    weights = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
    return KeyedJaggedTensor(["a", "b", "c"], values, lengths=lengths, weights=weights, stride=5)


def _loss(kt, step):
    target = torch.randn(kt.values().shape, generator=torch.Generator().manual_seed(100 + step))
    return ((kt.values() - target) ** 2).sum()


CASES = [  # (optimizer class, kwargs, the reference's torch optimizer, the reference needs sparse gradients)
    (torch.optim.SGD, {"lr": 0.05}, functools.partial(torch.optim.SGD, lr=0.05), False),
    (torch.optim.Adagrad, {"lr": 0.1, "eps": 1e-8}, functools.partial(torch.optim.Adagrad, lr=0.1, eps=1e-8), False),
    (RowWiseAdagrad, {"lr": 0.1}, functools.partial(RowWiseAdagrad, lr=0.1), False),
    (torch.optim.Adam, {"lr": 0.01}, functools.partial(torch.optim.SparseAdam, lr=0.01), True),
]


@pytest.mark.parametrize("opt_cls, kwargs, reference_opt, sparse", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_torch_optimizer(opt_cls, kwargs, reference_opt, sparse, weighted):
    fused = FusedEmbeddingBagCollection(TABLES, optimizer_type=opt_cls, optimizer_kwargs=kwargs,
                                        is_weighted=weighted, device=torch.device("cpu"))
    ref = EmbeddingBagCollection(TABLES, is_weighted=weighted)
    ref.load_state_dict(fused.state_dict())
    ref._sparse_grads = sparse   # SparseAdam: Adam on the touched rows only, as the fused update
    opt = reference_opt(ref.parameters())
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    for step in range(3):
        kjt = _batch(step, weighted)
        out = fused(kjt)
        torch.testing.assert_close(out.values(), ref(kjt).values(), rtol=1e-6, atol=1e-6)
        _loss(out, step).backward()
        opt.zero_grad()
        _loss(ref(kjt), step).backward()
        opt.step()
        assert all(p.grad is None for p in fused.parameters()), "the fused update must drop the gradient"
    moved = max((ref.state_dict()[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-3
    for key, want in ref.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[key], want, rtol=1e-5, atol=1e-6, msg=key)


def test_lr_scheduler_drives_the_fused_update():
    # StepLR halves lr after each step: the fused SGD must move rows by the scheduled lr, as torch does
    fused = FusedEmbeddingBagCollection(TABLES, torch.optim.SGD, {"lr": 0.4})
    ref = EmbeddingBagCollection(TABLES)
    ref.load_state_dict(fused.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.4)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (fused.fused_optimizer(), ref_opt)]
    for step in range(3):
        kjt = _batch(step, False)
        _loss(fused(kjt), step).backward()
        fused.fused_optimizer().step()   # a no-op (the update ran in backward), called as a training loop would
        ref_opt.zero_grad()
        _loss(ref(kjt), step).backward()
        ref_opt.step()
        for s in scheds:
            s.step()
    assert fused.fused_optimizer().param_groups[0]["lr"] == pytest.approx(0.05)
    for key, want in ref.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[key], want, rtol=1e-5, atol=1e-6, msg=key)


def test_torchrec_surface_and_refusals():
    fused = FusedEmbeddingBagCollection(TABLES, torch.optim.SGD, {"lr": 0.1})
    assert sorted(fused.state_dict()) == ["embedding_bags.t_mean.weight", "embedding_bags.t_sum.weight"]
    assert fused.optimizer_type is torch.optim.SGD and fused.optimizer_kwargs == {"lr": 0.1}
    assert isinstance(fused.fused_optimizer(), torch.optim.Optimizer)
    w = fused.embedding_bags["t_sum"].weight   # marked as torch's apply_optimizer_in_backward marks weights
    assert w._optimizer_classes == [torch.optim.SGD] and w._optimizer_kwargs == [{"lr": 0.1}]
    assert w._in_backward_optimizers == [fused.fused_optimizer()]
    with pytest.raises(ValueError, match="UVM"):
        FusedEmbeddingBagCollection(TABLES, torch.optim.SGD, {"lr": 0.1}, location="managed")
    with pytest.raises(ValueError, match="momentum"):
        FusedEmbeddingBagCollection(TABLES, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})
    with pytest.raises(ValueError, match="needs storage"):
        FusedEmbeddingBagCollection(TABLES, torch.optim.SGD, {"lr": 0.1}, device=torch.device("meta"))


def test_weights_are_views_of_the_stacked_tables():
    # load_state_dict (copy or assign=True) and weight.data = ... all reach the buffer the lookup reads
    fused = FusedEmbeddingBagCollection(TABLES, torch.optim.SGD, {"lr": 0.1})
    ref = EmbeddingBagCollection(TABLES, init_seed=7)
    kjt = _batch(0, False)
    fused.load_state_dict(ref.state_dict())
    torch.testing.assert_close(fused(kjt).values(), ref(kjt).values())
    fused.load_state_dict({k: v * 2 for k, v in ref.state_dict().items()}, assign=True)
    torch.testing.assert_close(fused(kjt).values(), ref(kjt).values() * 2)
    w = fused.embedding_bags["t_sum"].weight
    w.data = torch.zeros_like(w)
    _loss(fused(kjt), 0).backward()   # the update lands in the same storage the weight views
    assert w.abs().sum() > 0 and fused.embedding_bags["t_sum"].weight is w


def test_optimizer_state_round_trip_and_frozen_refusal():
    def run(f, steps):
        for step in steps:
            _loss(f(_batch(step, False)), step).backward()

    a = FusedEmbeddingBagCollection(TABLES, torch.optim.Adagrad, {"lr": 0.1})
    run(a, [0, 1])
    b = FusedEmbeddingBagCollection(TABLES, torch.optim.Adagrad, {"lr": 0.1})
    b.load_state_dict(a.state_dict())
    b.fused_optimizer().load_state_dict(a.fused_optimizer().state_dict())
    sums = [s["sum"] for s in b.fused_optimizer().state_dict()["state"].values()]
    assert all(s.abs().sum() > 0 for s in sums) and b.fused_optimizer().state_dict()["state"][0]["step"] == 2
    run(a, [2])
    run(b, [2])
    for key, want in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[key], want, rtol=0, atol=0, msg=key)
    b.embedding_bags["t_mean"].weight.requires_grad_(False)
    with pytest.raises(ValueError, match="'t_mean' has requires_grad=False"):
        b(_batch(3, False))
    with torch.no_grad():
        b(_batch(3, False))   # inference: nothing to train, fine


def test_variable_batch_matches_unsharded():
    fused = FusedEmbeddingBagCollection(TABLES, torch.optim.SGD, {"lr": 0.1})
    ref = EmbeddingBagCollection(TABLES)
    ref.load_state_dict(fused.state_dict())
    # a: 2 bags, b: 1, c: 2 (stride 2), with inverse indices expanding to a batch of 3
    kjt = KeyedJaggedTensor(["a", "b", "c"], torch.tensor([1, 2, 3, 4, 5, 6]), lengths=torch.tensor([2, 1, 1, 0, 2]),
                            stride_per_key_per_rank=[[2], [1], [2]],
                            inverse_indices=(["a", "b", "c"], torch.tensor([[0, 1, 1], [0, 0, 0], [1, 0, 1]])))
    torch.testing.assert_close(fused(kjt).values(), ref(kjt).values())
