"""DLRM training step: shardwise vs TorchRec (plain loop and TrainPipelineSparseDist), same model,
initial weights and batches; plus ``shardwise train`` itself.

The model is ``shardwise train``'s default (26 tables of 8..100k rows x 16, bottom MLP 13->64->16,
pairwise dots of 27 vectors, top MLP 367->64->32->1), fused Adagrad lr 0.05 on the tables, dense
Adam lr 0.003, batch 256 per rank, world 2. This interpreter pre-generates the batches from the
job's synthetic log (the same examples each rank reads in the job) and the initial weights (the
job's seeds) into one file that both libraries load.

- shardwise: the job's own ``Trainer`` (its dense runner, its step) fed the pre-generated batches, in
  variants: the planner's plan (the plan the job itself chose in the same round, which runs first: the
  planner's cost figures are measured at start-up, so two launches on a loaded machine can plan
  differently) or all table-wise, dense ``compile`` (``replicate``) or ``ddp``; a ``+pipelined`` suffix
  runs that step through the job's own ``TrainPipeline`` (the next batch's input dist overlapping the
  step, as in the job), still on the pre-generated batches; a ``+compiled`` suffix (e.g.
  ``planner+ddp+compiled``, not run by default) runs the tables' fused update through ``torch.compile``
  (``compile_optimizer=True``). ``job_default`` marks the variants of the job's default dense mode.
  ``job_loop``: the job's own loop in this launch (``Trainer._train``: batches drawn as it goes, its
  record and log steps; no checkpoints or reshard), paired with the pipelined step in the summary, free
  of the CLI run's launch-to-launch spread. 256 pre-generated steps (``--batches``): cycling 16 kept the
  rows they touch warm in the caches, both libraries' steps ~9% faster than on fresh batches.
- TorchRec: ``DistributedModelParallel`` with its own planner, the dense part under its DDP, the
  tables' Adagrad fused in backward; a plain loop and ``TrainPipelineSparseDist``.
- ``shardwise train`` itself, launched the way users run it (the CLI, with its defaults: data generated
  on the fly, progress logging, checkpoints, the live reshard; ``--quiet``): its ``ms_per_step`` is the
  median over blocks of 20 consecutive training steps of each block's mean (``metrics.json``'s
  ``throughput.steady.block_ms``: the statistic taken of the library step and of TorchRec's loops; start-up
  steps, the step after the reshard and checkpoint steps left out), next to its mean over every
  training step and its whole-run rate (which also pays for the checkpoint saves and the reshard), and
  each rank's peak RSS as the job reports it.

Every library line carries each rank's peak RSS next to what that rank must hold
(``peak_rss_mib_per_rank``, ``held_mib_per_rank``: its table shards with their Adagrad state, the dense
part with Adam's state and the batches, summed over the models the process holds: one per shardwise
variant, TorchRec's plain and pipelined ones).

One round = one launch of each; variants inside a launch run in rotating blocks of steps; every
block time is the slowest rank's. Ratios are medians over rounds of per-round ratios (paired), so
load from other processes hits both sides alike; the summary pairs the job with its own library step
(``ratio_shardwise_train/library_step``: the job's default variant, plain; ``.../library_step_pipelined``)
and with TorchRec's best loop of the same round. Every line carries the machine's load average when it
was printed (``load_avg``: 1, 5, 15 minutes). Every process runs with ``THP_MEM_ALLOC_ENABLE=1``, as
``shardwise train`` starts its workers (``--thp 0`` for 4 KiB pages everywhere; a value already in the
environment wins, as it does for the job). ``loss_first_steps`` (global mean loss of the first
steps from the initial weights) must agree between the libraries: the same model, weights and data.

    .venv/bin/python benchmarks/dlrm.py --torchrec-python ../torchrec-venv/bin/python  # ../shared/peers/torchrec-venv.sh
    .venv/bin/python benchmarks/dlrm.py --rounds 1 --no-job          # library step only

TorchRec runs in its own interpreter (``--torchrec-python`` or $SHARDWISE_TORCHREC_PYTHON, run with
PYTHONHASHSEED=0); without one it is skipped, saying so. This file and its TorchRec side
(``_dlrm_torchrec.py``) import nothing from shardwise at module level: the TorchRec interpreter runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dlrm_torchrec import local_bytes, mean_loss, run_torchrec, timed  # noqa: E402
from _launch import emit, rss_per_rank, spawn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_LOOP = "job_loop"
VARIANTS = ("planner+compile", "planner+ddp", "planner+ddp+pipelined", "table_wise+ddp", JOB_LOOP)
THP_ENV = "THP_MEM_ALLOC_ENABLE"   # shardwise.cli.THP_ENV: what `shardwise train` starts its workers with


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
    ms = timed(fns, args.blocks, args.inner, args.warmup)
    for fn in fns.values():
        getattr(fn, "drain", lambda: None)()
    plans = {v: _plan_summary(tr.plan) for v, tr in trainers.items()}
    # what this rank must hold: every variant's table shards with their Adagrad state, the dense
    # parts with Adam's state, and the batches
    held = sum(local_bytes(tr.sparse.state_dict()) + local_bytes(tr.sparse.fused_optimizer.state_dict()["state"])
               + local_bytes(tr.dense.state()) for tr in trainers.values())
    held += local_bytes(batches)
    return {"ms": ms, "losses": losses, "plans": plans, "rss": rss_per_rank(held)}


def _plan_summary(plan: dict) -> dict:
    kinds: dict = {}
    for ps in plan.values():
        kinds[ps.sharding_type.value] = kinds.get(ps.sharding_type.value, 0) + 1
    return kinds


# ---- shardwise train itself -----------------------------------------------------------------------
def run_job(args, tmp: str) -> dict:
    """``shardwise train`` as users run it (the CLI; ``--quiet``), its figures read from metrics.json."""
    out = os.path.join(tmp, "job")
    cmd = [sys.executable, "-m", "shardwise", "train", "--out", out, "--quiet", "--nproc-per-node", str(args.world)]
    cmd += ["--steps", str(args.job_steps)] if args.job_steps else []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"shardwise train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    thr = metrics["throughput"]
    steady = thr.get("steady") or {}
    per_step = args.world * args.batch
    # blocks of 20 counted steps, the median of their means: what the library lines take; a job
    # too short for one block falls back to the mean over its counted steps, then its whole-run rate
    block, mean = steady.get("block_ms"), thr.get("steady_examples_per_s")
    ms = block if block else per_step / (mean or thr["examples_per_s"]) * 1e3
    return {"ms_per_step": round(ms, 2), "examples_per_s": round(per_step / ms * 1e3),
            "source": "median of 20-step blocks" if block else "mean over training steps" if mean else
            "whole-run rate (includes checkpoints and the reshard)",
            "steady_mean_examples_per_s": round(mean) if mean else None,
            "whole_run_examples_per_s": round(thr["examples_per_s"]) if thr.get("examples_per_s") else None,
            "steps_counted": steady.get("steps_counted"), "steps": metrics["config"]["steps"],
            "reshard": metrics.get("reshard", {}).get("status"), "wall_s": round(wall, 1),
            "peak_rss_mib_per_rank": [round(r["peak_rss_bytes"] / 2**20, 1) for r in metrics.get("memory_per_rank", [])],
            "plan": _plan_summary_json(metrics["segments"][0]["plan"]), "plan_json": metrics["segments"][0]["plan"]}


def _plan_summary_json(plan_json: dict) -> dict:
    kinds: dict = {}
    for v in plan_json.values():
        kinds[v["type"]] = kinds.get(v["type"], 0) + 1
    return kinds


# ---- rounds ---------------------------------------------------------------------------------------
def torchrec_round(args, blob: str):
    python = args.torchrec_python or os.environ.get("SHARDWISE_TORCHREC_PYTHON")
    if not python or not os.path.exists(python):
        return None
    cmd = [python, os.path.abspath(__file__), "--impl", "torchrec", "--blob", blob] + _flags(args)
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH="")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        print(f"# TorchRec run failed, skipped:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _flags(args) -> list[str]:
    return ["--world", str(args.world), "--blocks", str(args.blocks), "--inner", str(args.inner),
            "--warmup", str(args.warmup), "--check-steps", str(args.check_steps), "--torchrec-plan", args.torchrec_plan]


def _ratio(a: list, b: list) -> float:
    return round(statistics.median(x / y for x, y in zip(a, b)), 3)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="per rank (the job's default)")
    p.add_argument("--batches", type=int, default=256, help="pre-generated steps, cycled (few flatter both steps)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--blocks", type=int, default=5, help="timed blocks per variant per round")
    p.add_argument("--inner", type=int, default=20, help="steps per block")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--check-steps", type=int, default=3, help="first steps whose losses are compared")
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    p.add_argument("--torchrec-python", default=None)
    p.add_argument("--torchrec-plan", choices=("planner", "table_wise"), default="planner",
                   help="TorchRec's own planner, or all tables table-wise round-robin")
    p.add_argument("--no-job", action="store_true", help="skip running `shardwise train` itself")
    p.add_argument("--job-steps", type=int, default=None, help="`shardwise train --steps` (default: its own)")
    p.add_argument("--thp", choices=("0", "1"), default="1",
                   help=f"{THP_ENV} for every process, as `shardwise train` starts its workers (default %(default)s; a "
                        f"value already in the environment wins)")
    p.add_argument("--impl", default="all", choices=["all", "torchrec"])
    p.add_argument("--blob", default=None)
    args = p.parse_args(argv)
    if args.impl == "torchrec":
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(spawn(run_torchrec, args.world, args, args.blob, tmp)), flush=True)
        return
    sys.path.insert(0, ROOT)
    os.environ.setdefault(THP_ENV, args.thp)   # inherited by every rank, TorchRec's and the job's
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")   # for spawned ranks
    python = args.torchrec_python or os.environ.get("SHARDWISE_TORCHREC_PYTHON")
    if not python or not os.path.exists(python):
        print(f"# TorchRec skipped: no interpreter (pass --torchrec-python or set SHARDWISE_TORCHREC_PYTHON; "
              f"got {python!r})", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        blob = os.path.join(tmp, "dlrm.pt")
        info = prepare(blob, args.world, args.batch, args.batches)
        shape = {"world": args.world, "batch_per_rank": args.batch, "tables": len(info["cards"]), "dim": info["dim"]}
        rounds = [one_round(args, blob, tmp, info, shape, i) for i in range(args.rounds)]
    summary(args, rounds, info, shape)


def _emit(rec: dict) -> None:
    """One JSON line, with the machine's load average (1, 5, 15 minutes) when it was printed."""
    emit({**rec, "load_avg": [round(x, 2) for x in os.getloadavg()]})


def one_round(args, blob: str, tmp: str, info: dict, shape: dict, i: int) -> dict:
    # the job first: the library's planner variants then run on the plan the job chose
    job = None if args.no_job else run_job(args, tmp)
    plan_json = job.pop("plan_json") if job else None
    ours = spawn(run_shardwise, args.world, args, blob, tmp, plan_json)
    default = f"planner+{info['default_dense']}"
    for v, ms in ours["ms"].items():
        _emit({"bench": "dlrm", "round": i, "impl": "shardwise", "variant": v, "ms_per_step": round(ms, 2),
               "job_default": v in (default, default + "+pipelined"), "pipelined": v.endswith("+pipelined"),
               "plan": ours["plans"][v], "plan_source": "the job's" if plan_json and v.startswith("planner+") else
               "table_wise round-robin" if v.startswith("table_wise+") else "shardwise's planner",
               "loss_first_steps": [round(x, 6) for x in ours["losses"][v]],
               "compiled_update": "+compiled" in v, **ours["rss"], **shape})
    theirs = torchrec_round(args, blob)
    for v, ms in (theirs or {"ms": {}})["ms"].items():
        _emit({"bench": "dlrm", "round": i, "impl": "torchrec", "variant": v, "ms_per_step": round(ms, 2),
               "plan": theirs["plans"]["torchrec"], "plan_source": args.torchrec_plan,
               "loss_first_steps": [round(x, 6) for x in theirs["losses"][v]], **theirs["rss"], **shape})
    if job is not None:
        _emit({"bench": "dlrm", "round": i, "impl": "shardwise_train", **job, **shape})
    return {"ours": ours["ms"], "theirs": theirs["ms"] if theirs else None,
            "job_ms": None if job is None else job["ms_per_step"], "load": os.getloadavg()[0]}


def summary(args, rounds: list, info: dict, shape: dict) -> None:
    rec = {"bench": "dlrm", "summary": True, "rounds": len(rounds), "default_dense": info["default_dense"], **shape,
           "load_avg_1min_per_round": [round(r["load"], 2) for r in rounds]}
    for v in args.variants:
        rec[f"shardwise_{v}_ms"] = round(statistics.median(r["ours"][v] for r in rounds), 2)
    job = [r for r in rounds if r["job_ms"]]
    if job:
        rec["shardwise_train_ms"] = round(statistics.median(r["job_ms"] for r in job), 2)
        rec["shardwise_train_examples_per_s"] = round(args.world * args.batch / rec["shardwise_train_ms"] * 1e3)
        # the job against its own step on pre-generated batches, launch by launch (paired)
        default = f"planner+{info['default_dense']}"
        for name, v in (("library_step", default), ("library_step_pipelined", default + "+pipelined")):
            if v in args.variants:
                rec[f"ratio_shardwise_train/{name}"] = _ratio([r["job_ms"] for r in job], [r["ours"][v] for r in job])
    pipelined = f"planner+{info['default_dense']}+pipelined"
    if JOB_LOOP in args.variants and pipelined in args.variants:   # the job's loop in the library's launch
        rec["ratio_job_loop/library_step_pipelined"] = _ratio([r["ours"][JOB_LOOP] for r in rounds],
                                                              [r["ours"][pipelined] for r in rounds])
    paired = [r for r in rounds if r["theirs"]]
    if paired:
        best = [min(r["theirs"].values()) for r in paired]
        for k in paired[0]["theirs"]:
            rec[f"torchrec_{k}_ms"] = round(statistics.median(r["theirs"][k] for r in paired), 2)
        rec["torchrec_best_examples_per_s"] = round(args.world * args.batch / statistics.median(best) * 1e3)
        for v in args.variants:
            rec[f"ratio_{v}/torchrec_best"] = _ratio([r["ours"][v] for r in paired], best)
        jobs = [r for r in paired if r["job_ms"]]
        if jobs:
            rec["ratio_shardwise_train/torchrec_best"] = _ratio([r["job_ms"] for r in jobs],
                                                                [min(r["theirs"].values()) for r in jobs])
    _emit(rec)


if __name__ == "__main__":
    main()
