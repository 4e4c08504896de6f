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
and with TorchRec's best loop of the same round. The job's loop in the library's launch is also paired
block by block (``ratio_job_loop/library_step_pipelined_per_block``, with its quartiles: each job_loop
block against the pipelined block of the same rotation, over every round), the most pairs the run
has; a round's median of 5 blocks moves ±5% on its own here. Every line carries the machine's load average when it
was printed (``load_avg``: 1, 5, 15 minutes). Every process runs with ``THP_MEM_ALLOC_ENABLE=1``, as
``shardwise train`` starts its workers (``--thp 0`` for 4 KiB pages everywhere; a value already in the
environment wins, as it does for the job). ``loss_first_steps`` (global mean loss of the first
steps from the initial weights) must agree between the libraries: the same model, weights and data.

    .venv/bin/python benchmarks/dlrm.py --torchrec-python ../torchrec-venv/bin/python  # ../shared/peers/torchrec-venv.sh
    .venv/bin/python benchmarks/dlrm.py --rounds 1 --no-job          # library step only

TorchRec runs in its own interpreter (``--torchrec-python`` or $SHARDWISE_TORCHREC_PYTHON, run with
PYTHONHASHSEED=0); without one it is skipped, saying so. This file, its shardwise side
(``_dlrm_shardwise.py``) and its TorchRec side (``_dlrm_torchrec.py``) import nothing from shardwise at
module level: the TorchRec interpreter runs them.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dlrm_shardwise import JOB_LOOP, prepare, run_shardwise  # noqa: E402
from _dlrm_torchrec import run_torchrec  # noqa: E402
from _launch import emit, spawn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("planner+compile", "planner+ddp", "planner+ddp+pipelined", "table_wise+ddp", JOB_LOOP)
THP_ENV = "THP_MEM_ALLOC_ENABLE"   # shardwise.cli.THP_ENV: what `shardwise train` starts its workers with


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
    return {"ours": ours["ms"], "ours_blocks": ours["blocks"], "theirs": theirs["ms"] if theirs else None,
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
        # the same, paired block by block (each job_loop block against the pipelined block of the same
        # rotation, a second or so apart) over every round: many more pairs than rounds
        pairs = [a / b for r in rounds for a, b in zip(r["ours_blocks"][JOB_LOOP], r["ours_blocks"][pipelined])]
        q1, mid, q3 = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
        rec["ratio_job_loop/library_step_pipelined_per_block"] = round(mid, 3)
        rec["ratio_job_loop/library_step_pipelined_per_block_quartiles"] = [round(q1, 3), round(q3, 3)]
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
