"""The shardwise side of ``benchmarks/dlrm.py``: the shared batches and initial weights it writes, the
job's ``Trainer`` in each library variant, and the job's own loop (``job_loop``); run in the ranks
that ``dlrm.py`` spawns (see its docstring for what each variant measures)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from _dlrm_torchrec import local_bytes, mean_loss, timed
from _launch import rss_per_rank

JOB_LOOP = "job_loop"


# ---- shared data --------------------------------------------------------------------------------
def prepare(path: str, world: int, batch: int, count: int) -> dict:
    """Write the batches each rank reads in the job's first ``count`` steps and the initial weights."""
    from shardwise.embedding import EmbeddingBagCollection
    from shardwise.train.budget import table_sizes
    from shardwise.train.config import TrainConfig
    from shardwise.train.data import default_cardinalities, open_data, to_model_inputs
    from shardwise.train.model import DLRMDense, make_tables

    cfg = TrainConfig()
    rows = cfg.rows or 100_000   # the job's synthetic default (shardwise.train.sizes.DEMO_ROWS)
    cards = table_sizes(default_cardinalities(rows), cfg.num_embeddings_per_feature, cfg.max_rows)
    data = open_data(None, cfg.seed, cards)
    per_rank = []
    for r in range(world):
        steps = []
        for i in range(count):
            dense, kjt, labels = to_model_inputs(data.batch(i * world * batch + r * batch, batch), cards, "cpu")
            steps.append((dense, kjt.values(), kjt.lengths(), labels))
        per_rank.append(steps)
    ebc = EmbeddingBagCollection(make_tables(cards, cfg.dim), device="cpu", init_seed=cfg.seed)
    tables = {name.split(".")[-2]: t.detach().clone() for name, t in ebc.state_dict().items()}
    with torch.random.fork_rng(devices=[]):     # the job's dense initialisation (train/loop.py)
        torch.manual_seed(cfg.seed + 1)
        arch = DLRMDense(len(cards), cfg.dim)
    blob = {"batches": per_rank, "tables": tables, "dense": arch.state_dict(), "cards": cards, "dim": cfg.dim,
            "keys": list(kjt.keys()), "lr_sparse": cfg.lr_sparse, "lr_dense": cfg.lr_dense}
    torch.save(blob, path)
    return {"cards": cards, "dim": cfg.dim, "default_dense": cfg.dense_parallel}


# ---- shardwise ----------------------------------------------------------------------------------
def _shardwise_trainer(variant: str, blob: dict, batches: list, tmp: str, plan_json=None):
    """The job's ``Trainer`` for ``variant``; ``planner`` variants take ``plan_json`` where given (the
    plan the job itself chose this round: the planner's cost figures are measured at start-up, so two
    launches on a loaded machine can plan differently)."""
    from torch.distributed.device_mesh import init_device_mesh

    from shardwise.train.replanning.replan import plan_from_json

    from shardwise.embedding import shard, table_wise
    from shardwise.sparse import KeyedJaggedTensor
    from shardwise.train.config import TrainConfig
    from shardwise.train.loop import Trainer
    from shardwise.train.model import make_ebc

    own_data = variant == JOB_LOOP   # the job's loop: its plan, its default dense mode, its own data
    plan_kind, dense_mode, *rest = (f"planner+{TrainConfig.dense_parallel}" if own_data else variant).split("+")
    rest = [r for r in rest if r != "pipelined"]
    cfg = TrainConfig(steps=1 << 30, quiet=True, checkpoint_every=0, reshard_at=0, dense_parallel=dense_mode,
                      out=os.path.join(tmp, variant))
    tr = Trainer(cfg, init_device_mesh("cpu", (dist.get_world_size(),)))
    given = plan_kind == "planner" and plan_json is not None
    if plan_kind == "table_wise" or rest == ["compiled"] or given:   # +compiled: the torch.compile'd EBC update
        if plan_kind == "table_wise":
            tr.plan = {t.name: table_wise(i % tr.world) for i, t in enumerate(tr.tables)}
        elif given:
            tr.plan = plan_from_json(plan_json)
        import functools
        tr.sparse = shard(make_ebc(tr.cards, cfg.dim, cfg.seed), tr.plan, mesh=tr.mesh,
                          optimizer=functools.partial(torch.optim.Adagrad, lr=cfg.lr_sparse),
                          compile_optimizer=rest == ["compiled"])
    if own_data:
        return tr
    inputs = [(d, KeyedJaggedTensor(blob["keys"], v, lengths=n), y) for d, v, n, y in batches]
    per_step = tr.world * cfg.batch_size
    # the job's own step, reading the pre-generated batch of the step it is at
    tr._inputs = lambda start, count: inputs[(start // per_step) % len(inputs)]
    return tr


def _job_loop(tr):
    """The job's training loop (``Trainer._train``: its data drawn as it goes, read ahead, its pipeline,
    its per-step record and log steps) in this launch; ``step.block(n)`` runs ``n`` steps in one call of
    the loop, as the job does, the run going on past them."""
    from shardwise.train.pipeline import TrainPipeline
    from shardwise.train.report import Progress
    from shardwise.train.report.steady import Steady
    from shardwise.train.report.steplog import StepLog

    last = [None]

    def train_batch(batch):   # the job's step, keeping its loss for the loss check
        out = tr._train_batch(batch)
        last[0] = out[0]
        return out
    pipe, batches = TrainPipeline(step=train_batch, sharded=tr.sparse), tr._batches()
    progress = Progress(tr.cfg.steps, tr.step, enabled=False)
    tr.steady, log = Steady(tr.world * tr.cfg.batch_size), StepLog(tr.history)
    t0 = time.perf_counter()

    def block(n: int) -> None:
        tr._train(pipe, batches, log, progress, t0, tr.step, until=tr.step + n)

    step = lambda: block(1) or (last[0], None)   # noqa: E731
    step.block, step.drain = block, pipe.drain
    return step


def _job_step(tr):
    """The job's own step (``Trainer._train_batch``) on this rank's slice of the step's global batch,
    unpipelined: the plain loop, as TorchRec's plain loop is timed."""
    b = tr.cfg.batch_size
    return tr._train_batch(tr._inputs(tr.cursor + tr.rank * b, b))


def _stepper(variant: str, tr):
    """One training step of ``variant`` per call: the plain step, or the job's ``TrainPipeline`` over
    the same pre-generated batches in the same order (``+pipelined``)."""
    if variant == JOB_LOOP:
        return _job_loop(tr)
    if "pipelined" not in variant.split("+"):
        return lambda: _job_step(tr)
    from shardwise.train.pipeline import TrainPipeline

    def batches():
        b = tr.cfg.batch_size
        cursor = tr.cursor
        while True:   # the batch of the step the pipeline fetches, one ahead of the step it trains
            yield tr._inputs(cursor + tr.rank * b, b)
            cursor += tr.world * b
    pipe, it = TrainPipeline(step=tr._train_batch, sharded=tr.sparse), batches()

    def step():
        return pipe.progress(it)
    step.drain = pipe.drain   # collective: finish the prefetched batch's input dist before other collectives
    return step


def run_shardwise(rank, world, args, blob_path, tmp, plan_json=None):
    from shardwise.train.replanning.replan import plan_to_json

    blob = torch.load(blob_path, weights_only=False, mmap=True)   # the other ranks' batches stay on disk
    batches = blob["batches"][rank]
    trainers = {}
    for v in args.variants:   # every planner variant on one plan: the job's, else the first one's
        trainers[v] = _shardwise_trainer(v, blob, batches, tmp, plan_json)
        if plan_json is None and v.startswith("planner+"):
            plan_json = plan_to_json(trainers[v].plan)
    fns = {v: _stepper(v, tr) for v, tr in trainers.items()}
    losses = {v: [mean_loss(fns[v]()[0]) for _ in range(args.check_steps)] for v in trainers}
    blocks: dict = {}
    ms = timed(fns, args.blocks, args.inner, args.warmup, blocks)
    for fn in fns.values():
        getattr(fn, "drain", lambda: None)()
    plans = {v: _plan_summary(tr.plan) for v, tr in trainers.items()}
    # what this rank must hold: every variant's table shards with their Adagrad state, the dense
    # parts with Adam's state, and the batches
    held = sum(local_bytes(tr.sparse.state_dict()) + local_bytes(tr.sparse.fused_optimizer.state_dict()["state"])
               + local_bytes(tr.dense.state()) for tr in trainers.values())
    held += local_bytes(batches)
    return {"ms": ms, "blocks": blocks, "losses": losses, "plans": plans, "rss": rss_per_rank(held)}


def _plan_summary(plan: dict) -> dict:
    kinds: dict = {}
    for ps in plan.values():
        kinds[ps.sharding_type.value] = kinds.get(ps.sharding_type.value, 0) + 1
    return kinds
