"""TrainPipeline: pipelined training equals the plain loop step for step (losses and weights), with a
short last batch, batch sizes that differ between ranks and a reshard between two steps; a bad batch
on one rank raises on every rank; the per-step all-gather of batch sizes is gone."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from shardwise.embedding import row_wise, shard, table_wise
from shardwise.testing import run_on_ranks, worker_mesh
from shardwise.train.pipeline import TrainPipeline

from ..embedding import common
from .sync_sgd import SyncSGD

DIM = sum(d * len(f) for _, _, d, f, _ in common.TABLES)
STEPS = 6          # the last batch is shorter (and of another size on every rank)
RESHARD_AFTER = 2  # a reshard between step 2 and step 3


class _Model(torch.nn.Module):
    def __init__(self, sharded):
        super().__init__()
        self.sparse = sharded
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            self.top = torch.nn.Linear(DIM, 1)
        self.prefetched = []   # per call: did the pipeline hand the sharded module this batch already?

    def forward(self, batch):
        kjt, target = batch
        pre = self.sparse._prefetched
        self.prefetched.append(pre is not None and pre.source is kjt)
        out = self.top(self.sparse(kjt).values()).squeeze(1)
        return ((out - target) ** 2).mean(), out


def _batches(rank, world):
    out = []
    for step in range(STEPS):
        size = 4 if step < STEPS - 1 else 1 + rank   # a short last batch, another size per rank
        kjt = common.make_batch(100 * step + rank, size, False)
        out.append((kjt, torch.randn(size, generator=torch.Generator().manual_seed(7 * step + rank))))
    return out


def _train(rank, world, plan, pipelined):
    ebc = common.make_ebc(seed=3)
    sharded = shard(ebc, plan, mesh=worker_mesh((world,)), optimizer=common.ADAGRAD)
    model = _Model(sharded)
    opt = SyncSGD(model.top.parameters(), lr=0.1)
    losses, data = [], _batches(rank, world)
    if pipelined:
        pipe, it = TrainPipeline(model, opt), iter(data)
        while True:
            try:
                loss, _ = pipe.progress(it)
            except StopIteration:
                break
            losses.append(loss.item())
            if len(losses) == RESHARD_AFTER:
                sharded.reshard({"t_a": table_wise(world - 1), "t_b": row_wise()})
    else:
        for batch in data:
            opt.zero_grad(set_to_none=True)
            loss, _ = model(batch)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == RESHARD_AFTER:
                sharded.reshard({"t_a": table_wise(world - 1), "t_b": row_wise()})
    weights = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    weights.update({k: v.detach().clone() for k, v in model.top.named_parameters()})
    return losses, weights, model.prefetched, sharded.sharding_plan()


def _pipelined_vs_plain(rank, world, plans):
    out = {}
    for name in plans:
        plan = common.plans(world)[name]
        plain = _train(rank, world, plan, pipelined=False)
        piped = _train(rank, world, plan, pipelined=True)
        loss_err = max(abs(a - b) for a, b in zip(plain[0], piped[0]))
        weight_err = max((plain[1][k] - piped[1][k]).abs().max().item() for k in plain[1])
        out[name] = {"steps": (len(plain[0]), len(piped[0])), "loss_err": loss_err, "weight_err": weight_err,
                     "prefetched": piped[2], "resharded": piped[3]["t_a"] == table_wise(world - 1),
                     "loss_moved": abs(plain[0][0] - plain[0][-2])}
    return out


@pytest.mark.parametrize("world,plans", [(2, ("mixed", "data_parallel")), (3, ("mixed",))])
def test_pipelined_training_equals_the_plain_loop(world, plans):
    # "mixed": row-, table-, column-wise and data-parallel groups; "data_parallel": no ids cross ranks
    for rank, res in enumerate(run_on_ranks(_pipelined_vs_plain, world, plans, timeout=300)):
        for name, r in res.items():
            assert r["steps"] == (STEPS, STEPS), (name, r)
            assert r["loss_err"] <= 1e-6 and r["weight_err"] <= 1e-6, (rank, name, r)
            assert r["loss_moved"] > 1e-4, (name, r)      # it trained: equal losses are not two no-ops
            assert r["resharded"], (name, r)
            # every batch's input dist was started before its step (the pipeline, not a plain forward)
            assert r["prefetched"] == [True] * STEPS, (name, r)


def _bad_batch_in_the_pipeline(rank, world):
    ebc = common.make_ebc(seed=3)
    sharded = shard(ebc, common.plans(world)["mixed"], mesh=worker_mesh((world,)), optimizer=common.SGD)
    model = _Model(sharded)
    data = _batches(rank, world)[:4]
    if rank == world - 1:   # batch 2 of the last rank has an id beyond its table
        kjt = data[2][0]
        values = kjt.values().clone()
        values[0] = 10**6
        data[2] = (type(kjt)(kjt.keys(), values, lengths=kjt.lengths(), stride=kjt.stride()), data[2][1])
    pipe, it, done = TrainPipeline(model, torch.optim.SGD(model.top.parameters(), lr=0.1)), iter(data), 0
    try:
        for _ in range(4):
            pipe.progress(it)
            done += 1
    except ValueError as e:
        return done, str(e)
    return done, None


def test_bad_batch_raises_on_every_rank_at_its_step():
    for done, err in run_on_ranks(_bad_batch_in_the_pipeline, 3, timeout=120):
        assert done == 2, (done, err)   # batches 0 and 1 trained, batch 2 failed everywhere
        assert err is not None and "rank(s) [2]" in err and "outside its table's rows" in err, err


def _collectives_per_forward(rank, world, plan_name):
    """The collectives one forward issues (names of torch.distributed calls), equal batch sizes."""
    ebc = common.make_ebc(seed=3)
    sharded = shard(ebc, common.plans(world)[plan_name], mesh=worker_mesh((world,)))
    kjt = common.make_batch(rank, 4, False)
    calls = []
    names = ("all_gather_into_tensor", "all_gather", "all_gather_single", "all_to_all_single", "all_reduce",
             "all_gather_object", "broadcast")
    saved = {n: getattr(dist, n) for n in names if hasattr(dist, n)}

    def spy(name, fn):
        @functools.wraps(fn)
        def wrapped(*a, **k):
            calls.append(name)
            return fn(*a, **k)
        return wrapped
    for n, fn in saved.items():
        setattr(dist, n, spy(n, fn))
    try:
        sharded(kjt)
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)
    return calls


def test_no_all_gather_of_batch_sizes_per_step():
    # all tables row-wise, one group: a header all-to-all (batch sizes and flags ride here), one
    # lengths + ids all-to-all, the pooled output all-to-all; no all-gather
    calls = run_on_ranks(_collectives_per_forward, 2, "row_wise")[0]
    assert calls == ["all_to_all_single"] * 3, calls


def _pipelined_sequence(rank, world, plan_name):
    """A ShardedEmbeddingCollection through the pipeline (a reshard after step 2) against the
    unsharded module trained in plain PyTorch on the global batch."""
    from ..embedding.sequence import common as seq

    steps = 4
    ref = seq.reference_train(seq.make_ec(seed=2), seq.ADAGRAD, world, steps)
    sharded = shard(seq.make_ec(seed=2), seq.plans(world)[plan_name], mesh=worker_mesh((world,)),
                    optimizer=seq.ADAGRAD)
    done, prefetched = [], []

    def step(batch):
        kjt, i = batch
        pre = sharded._prefetched
        prefetched.append(pre is not None and pre.source is kjt)
        seq.loss_fn(sharded(kjt), i, rank).backward()
        done.append(i)
        if i == 1:
            sharded.reshard(seq.plans(world)["mixed2"])

    pipe = TrainPipeline(step=step, sharded=sharded)
    it = iter([(seq.rank_batches(world, i)[rank], i) for i in range(steps)])
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break
    return done, prefetched, seq.max_diff(seq.full_weights(sharded), ref)


@pytest.mark.parametrize("plan_name", ["mixed", "data_parallel"])
def test_pipelined_embedding_collection_equals_the_unsharded_module(plan_name):
    for rank, (done, prefetched, err) in enumerate(run_on_ranks(_pipelined_sequence, 2, plan_name, timeout=300)):
        assert done == [0, 1, 2, 3] and prefetched == [True] * 4, (rank, done, prefetched)
        assert err <= 1e-5, (rank, plan_name, err)
