"""loss_parallel(): cross-entropy / nll_loss / log_softmax on class-sharded logits equal plain torch
(values and input gradients), run PyTorch's collective count, raise PyTorch's errors, and stay inside
the calling context."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

# (input shape, class dim); 9 classes: uneven slices over 2 ranks
SHAPES = [((6, 9), 1), ((2, 9, 3), 1), ((9,), 0)]
CASES = [
    dict(reduction="mean"), dict(reduction="sum"), dict(reduction="none"),
    dict(reduction="mean", ignore_index=3), dict(reduction="mean", weight=True),
    dict(reduction="none", weight=True), dict(reduction="mean", label_smoothing=0.2),
    dict(reduction="sum", label_smoothing=0.1, weight=True), dict(reduction="none", label_smoothing=0.3),
]


def _data(shape, cdim, case, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    tshape = tuple(s for d, s in enumerate(shape) if d != cdim)
    t = torch.randint(0, shape[cdim], tshape, generator=g)
    if t.ndim:
        t.view(-1)[::4] = case.get("ignore_index", -100)  # some ignored targets
    kw = {k: v for k, v in case.items() if k != "weight"}
    if case.get("weight"):
        kw["weight"] = torch.rand(shape[cdim], generator=g) + 0.5
    return x, t, kw


def _loss_fn(kind):
    if kind == "ce":
        return F.cross_entropy
    return lambda x, t, **kw: F.nll_loss(F.log_softmax(x, 1 if x.ndim > 1 else 0), t, **kw)


def values(rank, world, kind):
    from torch.distributed.tensor import Replicate as TReplicate, Shard as TShard, distribute_tensor as tdistribute
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

    from shardwise.parallel import loss_parallel
    from shardwise.tensor import CollectiveCounter, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    fn = _loss_fn(kind)
    out = []
    for shape, cdim in SHAPES:
        for case in CASES:
            if kind == "nll" and "label_smoothing" in case:
                continue
            x, t, kw = _data(shape, cdim, case)
            ref_x = x.clone().requires_grad_()
            ref = fn(ref_x, t, **kw)
            g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(9))
            ref.backward(g)
            dx = distribute_tensor(x, mesh, [Shard(cdim)]).requires_grad_()
            with CollectiveCounter() as fwd, loss_parallel():
                loss = fn(dx, t, **kw)
            with CollectiveCounter() as bwd, loss_parallel():
                loss.backward(distribute_tensor(g, mesh, list(loss.placements)))
            err = max((loss.full_tensor() - ref).abs().max().item(), (dx.grad.full_tensor() - ref_x.grad).abs().max().item())
            theirs = None
            # PyTorch's loss_parallel does not support label smoothing, and its backward indexes the weight
            # with the ignore_index (an index error) when a weight meets ignored targets
            if "label_smoothing" not in case and "weight" not in case:
                tx = tdistribute(x, mesh, [TShard(cdim)]).requires_grad_()
                tg = tdistribute(g, mesh, [TReplicate()])
                with CommDebugMode() as cm, torch_loss_parallel():
                    tl = fn(tx, t, **kw)
                    tl.backward(tg)
                theirs = cm.get_total_counts()
            out.append((shape, case, err, str(loss.placements), str(dx.grad.placements), fwd.total, bwd.total, theirs))
    return out


@pytest.mark.parametrize("kind", ["ce", "nll"])
def test_loss_parallel_equals_plain_torch_with_pytorch_collectives(kind):
    for shape, case, err, lp, gp, fwd, bwd, theirs in run_on_ranks(values, 2, kind)[0]:
        what = (shape, case)
        assert err < 1e-5, (what, err)
        assert gp == "(Shard(dim=%d),)" % (0 if len(shape) == 1 else 1), (what, gp)
        assert lp == "(Replicate(),)", (what, lp)
        assert fwd == 3, (what, fwd)  # max, sum of exponentials, the target's logit
        # cross-entropy's backward is local; log_softmax alone needs the class sum of its gradient
        assert bwd == (0 if kind == "ce" else 1), (what, bwd)
        if theirs is not None:
            assert fwd + bwd >= theirs and (kind == "nll" or fwd + bwd == theirs), (what, fwd, bwd, theirs)


def two_d(rank, world, reduction):
    from shardwise.parallel import loss_parallel
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((2, 2))
    x, t, kw = _data((8, 10), 1, {"reduction": reduction}, seed=3)
    ref_x = x.clone().requires_grad_()
    ref = F.cross_entropy(ref_x, t, **kw)
    ref.sum().backward()
    dx = distribute_tensor(x, mesh, [Shard(0), Shard(1)]).requires_grad_()
    dt = distribute_tensor(t, mesh, [Shard(0), __import__("shardwise.tensor").tensor.Replicate()])
    with loss_parallel():
        try:
            loss = F.cross_entropy(dx, dt, **kw)
        except NotImplementedError as e:
            return str(e)
        loss.sum().backward()
    err = max((loss.full_tensor() - ref).abs().max().item(), (dx.grad.full_tensor() - ref_x.grad).abs().max().item())
    return err, str(loss.placements)


def test_loss_parallel_on_a_2d_mesh_batch_and_class_sharded():
    for err, placements in run_on_ranks(two_d, 4, "sum"):
        assert err < 1e-5 and placements == "(Partial(reduce_op='sum'), Replicate())", (err, placements)
    for err, placements in run_on_ranks(two_d, 4, "none"):
        assert err < 1e-5 and placements == "(Shard(dim=0), Replicate())", (err, placements)
    assert all("reduction='mean' is only supported on one-dimensional" in m for m in run_on_ranks(two_d, 4, "mean"))


def errors(rank, world):
    from shardwise.parallel import loss_parallel
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    x, t = torch.randn(4, 6), torch.randint(0, 6, (4,))
    got = []
    calls = [
        lambda: F.cross_entropy(distribute_tensor(x, mesh, [Replicate()]), t),  # class dim not sharded
        lambda: F.cross_entropy(distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(t, mesh, [Shard(0)])),
        lambda: F.cross_entropy(distribute_tensor(x, mesh, [Shard(1)]), torch.rand(4, 6)),  # probabilities
        lambda: F.log_softmax(distribute_tensor(x, mesh, [Shard(0)]), 1),
    ]
    for call in calls:
        try:
            with loss_parallel():
                call()
            got.append("no error")
        except (ValueError, RuntimeError, NotImplementedError) as e:
            got.append(f"{type(e).__name__}: {e}")
    return got


def test_pytorch_errors_for_unsupported_layouts():
    got = run_on_ranks(errors, 2)[0]
    assert got[0].startswith("ValueError: loss_parallel() requires exactly one mesh dim to shard tensor dimension 1")
    assert got[1].startswith("RuntimeError: Expected (Replicate(),) but got (Shard(dim=0),)"), got[1]
    assert got[2].startswith("NotImplementedError: loss_parallel(): target must hold class indices"), got[2]
    assert got[3].startswith("ValueError: loss_parallel() requires exactly one mesh dim"), got[3]


def other_thread(rank, world):
    """The block is this context's: a thread running meanwhile takes the ordinary path."""
    from shardwise.parallel import loss_parallel
    from shardwise.tensor import CollectiveCounter, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    x, t = torch.randn(4, 6), torch.randint(0, 6, (4,))
    dx, dt = distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(t, mesh, [Replicate()])
    seen = {}

    def run(name):
        with CollectiveCounter() as c:
            loss = F.cross_entropy(dx, dt)
        seen[name] = (dict(c.counts), abs(loss.full_tensor().item() - F.cross_entropy(x, t).item()))

    with loss_parallel():
        th = threading.Thread(target=run, args=("thread",))
        th.start()
        th.join(timeout=60)
        run("block")
    assert not th.is_alive()
    return seen


def test_loss_parallel_is_per_context():
    seen = run_on_ranks(other_thread, 2)[0]
    assert seen["block"][0] == {"all_reduce": 3} and seen["block"][1] < 1e-6, seen
    # the ordinary rules move the logits (all-to-all to a batch shard) before the loss
    assert "all_to_all" in seen["thread"][0] and seen["thread"][1] < 1e-6, seen


def llama_step(rank, world):
    """torchtitan's flow: class-sharded logits from the output projection, flattened, cross-entropy in
    the block; loss and gradients equal the plain model's, collectives equal PyTorch DTensor's."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

    from shardwise.parallel import loss_parallel
    from shardwise.tensor import CollectiveCounter

    from .llama_tp_model import Config, Styles, batch, make, parallelize

    mesh, cfg = worker_mesh((world,)), Config()
    tokens, labels = batch(cfg)
    labels[0, :3] = -100
    ref = make(cfg)
    ref_loss = F.cross_entropy(ref(tokens).flatten(0, 1), labels.flatten())
    ref_loss.backward()
    out = {}
    for lib, block, counter in (("shardwise", loss_parallel, CollectiveCounter), ("torch", torch_loss_parallel, CommDebugMode)):
        model = parallelize(make(cfg), Styles(lib), mesh, loss_parallel=True)
        with counter() as c, block():
            loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
            loss.backward()
        total = c.total if lib == "shardwise" else c.get_total_counts()
        grads = dict(ref.named_parameters())
        err = max((p.grad.full_tensor() - grads[n].grad).abs().max().item() for n, p in model.named_parameters())
        out[lib] = (total, abs(loss.full_tensor().item() - ref_loss.item()), err)
    return out


def test_llama_like_step_with_loss_parallel_matches_plain_and_pytorch_counts():
    out = run_on_ranks(llama_step, 2)[0]
    (ours, loss_err, err), (theirs, _, _) = out["shardwise"], out["torch"]
    assert loss_err < 1e-5 and err < 1e-5, out
    assert ours == theirs, out
