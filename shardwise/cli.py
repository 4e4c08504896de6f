"""The ``shardwise`` command: ``train``, ``plan``, ``data``, ``export``, ``predict``, ``bench``, ``validate``.

Example::

    shardwise train                         # 2 local processes, synthetic click log, report in ./shardwise-report
    shardwise data prepare day_0.tsv.gz --out prepared --categorify
    shardwise train --data prepared --steps 2000 --nproc-per-node 4   # table sizes from its manifest
    shardwise train --data day_0.tsv --rows 1000000                   # raw ids: the sizes must be given
    shardwise export shardwise-report --out exported     # the trained model, unsharded
    shardwise predict exported day_1.tsv.gz --out scores.txt
    shardwise plan --tables 8 --rows 1000000 --dim 64 --world 4
    shardwise plan --config tables.json --world 64 --ranks-per-host 8 --json
    shardwise bench
    shardwise validate --op mm
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

__all__ = ["main", "build_parser"]


# Read by torch's CPU allocator once, at a process's first allocation: the memory of tensors of 2 MiB
# or more is then advised for transparent huge pages (madvise). A fresh page's first touch is most of what a
# reshard into new stores costs on CPU, and 2 MiB pages fault in 512x fewer times.
THP_ENV = "THP_MEM_ALLOC_ENABLE"


@contextlib.contextmanager
def worker_environment():
    """While open: ``THP_MEM_ALLOC_ENABLE=1`` in this process's environment, which the workers started
    meanwhile inherit, unless the user already set it to anything (their own value wins); removed
    again on exit, so a caller of :func:`main` keeps its environment. Only ``shardwise train`` opens
    it, around the launch; the library never sets the variable.

    Example:
        >>> with worker_environment():            # around launch(cfg, 2): the workers inherit it
        ...     os.environ["THP_MEM_ALLOC_ENABLE"]
        '1'
        >>> "THP_MEM_ALLOC_ENABLE" in os.environ  # unset before, so removed again
        False
    """
    if THP_ENV in os.environ:
        yield
        return
    os.environ[THP_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(THP_ENV, None)


class _TRAIN_DEFAULTS:   # `shardwise plan` plans by default what `shardwise train` would (no torch import here)
    rows, dim, batch_size = 100_000, 16, 256


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardwise", description="Shard PyTorch training across processes and machines.")
    sub = p.add_subparsers(dest="command", metavar="{train,plan,data,export,predict,bench,validate}")
    sub.required = True
    _train_parser(sub)
    from .data.cli import add_data_commands   # `shardwise data prepare`; its handler rides on the namespace
    add_data_commands(sub)
    from .serve.cli import add_serve_commands   # `shardwise export` / `shardwise predict`
    add_serve_commands(sub)
    pl = sub.add_parser("plan", help="print a sharding plan without training",
                        description="Plan tables over W ranks and print the plan with its estimate. The tables: "
                                    "--config FILE (JSON, or YAML with PyYAML), or --tables N equal tables of "
                                    "--rows x --dim, or else the 26 tables `shardwise train` plans (the largest "
                                    "has --rows rows, as in train).")
    pl.add_argument("--config", default=None, metavar="FILE",
                    help="table configs: a JSON list of {name, rows, dim, features, ids_per_bag} (YAML with PyYAML)")
    pl.add_argument("--tables", type=int, default=None, help="plan N equal tables of --rows x --dim")
    pl.add_argument("--rows", type=int, default=None,
                    help=f"rows of the largest table, as in `shardwise train`; with --tables N every table has them "
                         f"(default {_TRAIN_DEFAULTS.rows})")
    pl.add_argument("--dim", type=int, default=None, help=f"embedding dimension (default {_TRAIN_DEFAULTS.dim})")
    pl.add_argument("--ids-per-bag", type=float, default=1.0,
                    help="ids per bag of each feature where the config does not say (default %(default)s)")
    pl.add_argument("--calibration", default=None, metavar="FILE",
                    help="cost figures to plan with: a `shardwise train` metrics.json or a Calibration JSON "
                         "(default: nominal figures of no particular machine)")
    pl.add_argument("--sharding-types", default=None, metavar="T1,T2",
                    help="types the planner may choose among (default: all; for the train job's tables the "
                         "job's own: table_wise,row_wise,data_parallel)")
    pl.add_argument("--world", type=int, default=2, help="number of ranks (default %(default)s)")
    pl.add_argument("--batch-size", type=int, default=_TRAIN_DEFAULTS.batch_size,
                    help="examples per rank per step (default %(default)s, as in train)")
    pl.add_argument("--memory-per-rank", dest="memory", type=_bytes, default=1 << 30, metavar="SIZE",
                    help="memory per rank for embeddings (weights + optimizer state), e.g. 6GiB; the plan is for "
                         "a cluster that need not be this machine, so the default is explicit: 1GiB")
    pl.add_argument("--memory-mb", type=float, default=None, help="the same in MiB (alias of --memory-per-rank)")
    pl.add_argument("--ranks-per-host", type=int, default=None,
                    help="ranks per host (default: all on one host); tables may then go table-row-wise in a host")
    pl.add_argument("--json", action="store_true", help="print the plan and its estimate as one JSON object")
    b = sub.add_parser("bench", help="run the benchmark scripts and print their ratio lines",
                       description="Run benchmarks/*.py one after another; print the JSON lines with ratios.")
    b.add_argument("--only", action="append", default=[], help="run only this script (e.g. ebc); repeatable")
    b.add_argument("--all-lines", action="store_true", help="print every JSON line, not only ratios")
    sub.add_parser("validate", help="check every sharding rule against plain PyTorch", add_help=False,
                   description="Arguments are passed to the validator; see `shardwise validate --help`.")
    return p


def _train_parser(sub) -> None:
    from .train.worker import add_train_arguments

    t = sub.add_parser("train", help="train the DLRM demo job across local processes (or many machines)",
                       description="Train a DLRM-style click model: sharded embeddings, data-parallel MLPs. "
                                   "Launches the workers with torch's elastic launcher (as torchrun does). "
                                   f"The workers start with {THP_ENV}=1 (torch's CPU allocator then puts tensors "
                                   "of 2 MiB or more on transparent huge pages: a reshard that fills new stores "
                                   f"took a third to a half less CPU here) unless {THP_ENV} is already set, "
                                   f"e.g. {THP_ENV}=0 to keep 4 KiB pages.")
    add_train_arguments(t)
    t.add_argument("--nproc-per-node", "--world-size", dest="nproc_per_node", type=int, default=2,
                   help="processes on this machine; on one machine this is the world size, which may differ "
                        "on --resume (default %(default)s)")
    t.add_argument("--nnodes", default="1", help="machines, N or MIN:MAX (default %(default)s)")
    t.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT every machine meets at (multi-machine runs)")
    t.add_argument("--rdzv-id", default=None, help="job id shared by all machines (multi-machine runs)")
    t.add_argument("--node-rank", type=int, default=None, help="this machine's rank (optional)")
    t.add_argument("--max-restarts", type=int, default=0,
                   help="restarts of the worker group after a failure (elastic launcher; default %(default)s)")


def _cmd_train(ns) -> int:
    from .train.checkpoint import resume_point
    from .train.data import check_logs
    from .train.launching.launch import launch
    from .train.worker import check_output_paths, config_from_args

    import torch

    from .train.launching.host import choose_device

    cfg = config_from_args(ns)
    check_output_paths(cfg)
    # decided here, once for this machine's processes: NCCL refuses two ranks on one GPU
    cfg.device = choose_device(cfg.device, ns.nproc_per_node, torch.cuda.device_count())
    if cfg.eval_fraction and not Path(cfg.data).is_dir():
        raise ValueError(f"--eval-fraction holds out the end of --data, which a stream of text logs does not know "
                         f"in advance: prepare them first (shardwise data prepare {cfg.data.replace(',', ' ')} "
                         f"--out DIR, then --data DIR) or pass --eval-data")
    from .train.evaluate import eval_vocabulary
    from .train.sizes import job_tables

    bad = 0
    for path in (cfg.data, cfg.eval_data):
        if path:
            bad += check_logs(path, cfg.skip_bad_lines) or 0   # a malformed input fails here, before any process starts
    # table sizes and the held-out data's vocabulary agree with the data, or fail here, before the launch
    eval_vocabulary(job_tables(cfg).vocabulary, cfg.eval_data)
    if cfg.resume:
        resume_point(cfg)     # so does a missing or mismatched checkpoint
    from .train.launching.host import host_cores
    from .train.launching.prelaunch import check_before_launch
    from .train.worker import memory_flag

    world = ns.nproc_per_node * int(ns.nnodes) if str(ns.nnodes).isdigit() else None
    for note in check_before_launch(cfg, world, ns.nproc_per_node, host_cores(), memory_flag(ns)):
        print(note, file=sys.stderr)
    if bad:
        print(f"--skip-bad-lines: {bad:,} malformed line(s) in the inputs (each file read in full before launch) "
              f"will be skipped", file=sys.stderr)
    try:
        with worker_environment():   # the workers (and restarted ones) inherit it
            metrics = launch(cfg, ns.nproc_per_node, ns.nnodes, ns.rdzv_endpoint, ns.rdzv_id, ns.max_restarts,
                             ns.node_rank)
    except Exception as e:   # the launcher's ChildFailedError: name the ranks, the causes, the way on
        if type(e).__name__ != "ChildFailedError":
            raise
        from .train.launching.launch import describe_failure

        print(describe_failure(e, cfg, ns.max_restarts), file=sys.stderr)
        return 1
    if metrics and cfg.skip_bad_lines:
        print(f"--skip-bad-lines: {metrics.get('bad_lines_skipped', 0):,} malformed line(s) skipped in the lines this "
              f"run read" + (f" ({bad:,} in the whole inputs)" if bad else ""))
    return 0


def _bytes(text: str) -> int:
    from .train.budget import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _plan_tables(ns) -> tuple:
    """(tables, ids per bag, sharding types, title) from --config, --tables or the train job's defaults."""
    from .embedding import EmbeddingBagConfig, ShardingType, load_table_configs

    given = [f"--{n}" for n in ("tables", "rows", "dim") if getattr(ns, n) is not None]
    if ns.config and given:
        raise ValueError(f"--config gives the tables, so {', '.join(given)} would be ignored; pass one or the other")
    types = None
    if ns.sharding_types is not None:
        names = [x.strip() for x in ns.sharding_types.split(",") if x.strip()]
        known = [t.value for t in ShardingType]
        if not names or any(n not in known for n in names):
            raise ValueError(f"--sharding-types={ns.sharding_types!r} must list some of {known}, e.g. table_wise")
        types = [ShardingType(n) for n in names]
    if ns.config:
        tables, ids = load_table_configs(ns.config, ns.ids_per_bag)
        return tables, ids, types, f"plan: {len(tables)} tables from {ns.config} on {ns.world} ranks"
    rows = _TRAIN_DEFAULTS.rows if ns.rows is None else ns.rows
    dim = _TRAIN_DEFAULTS.dim if ns.dim is None else ns.dim
    if ns.tables is not None:
        tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"])
                  for i in range(ns.tables)]
        return tables, ns.ids_per_bag, types, f"plan: {ns.tables} tables x {rows} rows x {dim} on {ns.world} ranks"
    from .train.config import JOB_SHARDING_TYPES
    from .train.data import default_cardinalities
    from .train.model import make_tables

    if rows < 8:
        raise ValueError(f"--rows={rows} must be >= 8: the train job's smallest table has 8 rows "
                         f"(or pass --tables N for N equal tables)")
    tables = make_tables(default_cardinalities(rows), dim)
    types = types or [ShardingType(t) for t in JOB_SHARDING_TYPES]
    return tables, ns.ids_per_bag, types, (f"plan: the train job's 26 tables (largest {rows} rows) x {dim} "
                                           f"on {ns.world} ranks")


def _cmd_plan(ns) -> int:
    from .embedding import Calibration, GreedyShardingPlanner
    from .train.report import print_plan

    for name in ("tables", "rows", "dim", "world", "batch_size"):
        if getattr(ns, name) is not None and getattr(ns, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(ns, name)} must be >= 1")
    if ns.memory_mb is not None:
        if not ns.memory_mb > 0:   # also catches nan
            raise ValueError(f"--memory-mb={ns.memory_mb} must be > 0 (MiB of embedding memory per rank)")
        ns.memory = int(ns.memory_mb * 2**20)
    cal = None
    if ns.calibration:
        try:
            cal = Calibration.from_json(Path(ns.calibration).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--calibration {ns.calibration!r}: {e}") from None
    tables, ids, types, title = _plan_tables(ns)
    planner = GreedyShardingPlanner(ns.world, ns.memory, batch_size_per_rank=ns.batch_size,
                                       ids_per_bag=ids, ranks_per_host=ns.ranks_per_host, sharding_types=types,
                                       calibration=cal, memory_flag="--memory-per-rank")
    plan = planner.plan(tables)
    if ns.json:
        print(json.dumps(planner.plan_record(plan, tables)))
        return 0
    print_plan(planner, plan, tables, title)
    return 0


def _is_ratio_line(rec: dict) -> bool:
    return rec.get("config") == "ratios" or any("ratio" in k or "_vs_" in k for k in rec)


def _cmd_bench(ns) -> int:
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_")) if folder.is_dir() else []
    if ns.only:
        scripts = [p for p in scripts if p.stem in ns.only]
    if not scripts:
        raise ValueError(f"no benchmark scripts found in {folder} (only={ns.only}); run from a source checkout")
    failed = 0
    for script in scripts:
        print(f"# {script.name}", flush=True)
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=folder.parent)
        for line in proc.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and (ns.all_lines or _is_ratio_line(rec)):
                print(line.rstrip(), flush=True)
        if proc.wait():
            failed += 1
            print(f"# {script.name} exited with status {proc.returncode}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Optional[list] = None) -> int:
    """Entry point of the ``shardwise`` console script and ``python -m shardwise``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "validate":
        from .tensor.validate import main as validate_main

        return validate_main(argv[1:])
    ns = build_parser().parse_args(argv)
    try:
        handler = getattr(ns, "handler", None) or \
            {"train": _cmd_train, "plan": _cmd_plan, "bench": _cmd_bench}[ns.command]
        return handler(ns)
    except ValueError as e:
        print(f"shardwise {ns.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
