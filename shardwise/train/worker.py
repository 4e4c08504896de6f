"""The per-process entry point: what ``shardwise train`` launches on every rank, and what ``torchrun``
runs directly on a cluster.

Example (two machines, two processes each; run on both)::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint host0:29400 \\
        -m shardwise.train.worker --steps 1000 --out report
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
from pathlib import Path
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from .config import TrainConfig

__all__ = ["main", "run_worker", "add_train_arguments", "config_from_args", "check_output_paths", "memory_flag"]


def _size_mb(text: str) -> float:
    from .budget import parse_size

    try:
        return parse_size(text) / 2**20
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _int_list(text: str) -> list:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints, e.g. 1460,583,10131227")


def _name_list(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """The job's flags (shared by ``shardwise train`` and ``python -m shardwise.train.worker``)."""
    d = TrainConfig()
    p.add_argument("--steps", type=int, default=d.steps, help="training steps (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="examples per rank per step (default %(default)s)")
    p.add_argument("--out", default=d.out, help="report folder (default %(default)s)")
    p.add_argument("--reshard-at", type=int, default=None,
                   help="step of the live reshard from measured load; 0 turns it off (default: half of --steps)")
    p.add_argument("--reshard-min-window", type=int, default=d.reshard_min_window,
                   help="steps of measured load the reshard needs on the current processes: after a resume or "
                        "restart it waits until the new processes have measured this many (default %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help="save a checkpoint every K steps and at the end; 0 = never (default %(default)s)")
    p.add_argument("--checkpoint-dir", default=None, help="checkpoint folder (default: OUT/checkpoints)")
    p.add_argument("--resume", action="store_true", help="continue from the newest committed checkpoint")
    p.add_argument("--data", default=None,
                   help="Criteo-format logs: a .tsv or .tsv.gz file, several comma-separated, or a folder made by "
                        "`shardwise data prepare` (default: the built-in synthetic click log)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed for data and initialisation (default %(default)s)")
    p.add_argument("--dense-parallel", choices=("compile", "ddp"), default=d.dense_parallel,
                   help="data parallelism of the dense MLPs (default %(default)s)")
    p.add_argument("--compile-update", action="store_true",
                   help="run the tables' fused optimizer update through torch.compile: faster steps after a "
                        "compile at start-up (tens of seconds the first time, cached on disk after); pays off "
                        "in long runs")
    p.add_argument("--rows", type=int, default=None,
                   help="rows of the largest table: the synthetic log's (default 100000), or raw-id logs' tables, "
                        "ids folding by id %% rows (a categorified folder's manifest gives the sizes instead)")
    p.add_argument("--dim", type=int, default=d.dim, help="embedding dimension (default %(default)s)")
    p.add_argument("--memory-per-rank", dest="memory_per_rank_mb", type=_size_mb, default=None, metavar="SIZE",
                   help="embedding memory per rank (weights + optimizer state), e.g. 6GiB, that the plan, a resume "
                        "and the live reshard must respect (default: measured on rank 0 -- the GPU's free memory, "
                        "or the machine's available memory / the ranks on its host -- minus headroom)")
    p.add_argument("--memory-per-rank-mb", dest="memory_per_rank_mb_alias", type=float, help=argparse.SUPPRESS)
    p.add_argument("--num-embeddings-per-feature", type=_int_list, default=None, metavar="N1,...,N26",
                   help="the 26 table sizes (TorchRec's DLRM flag; wins over --rows); with a categorified --data "
                        "folder, not needed and refused if it disagrees with the folder's manifest")
    p.add_argument("--max-rows", type=int, default=None,
                   help="cap every table at M rows; ids fold modulo the table size (DLRM's max index range)")
    p.add_argument("--eval-data", default=None, help="held-out Criteo-format file(s) or prepared folder scored at the end")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip malformed lines of --data (counted in metrics.json) instead of failing every rank")
    p.add_argument("--eval-rows", type=int, default=None, metavar="N",
                   help="score at most N held-out rows at the end (default: all of --eval-data or the held-out "
                        "fraction, batched over every rank; 8192 of the synthetic log, or of the first rows of --data "
                        "when nothing is held out)")
    p.add_argument("--eval-fraction", type=float, default=None,
                   help="hold out the last fraction F of --data (never trained on) and score it at the end")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per process (default: this host's cores / the ranks running on this host)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cuda (NCCL, one GPU per local process: cuda:LOCAL_RANK) or cpu (gloo); default: cuda when "
                        "this machine has at least as many GPUs as local processes, else cpu")
    p.add_argument("--quiet", action="store_true", help="no plan table, progress bar or final summary (the report is still written)")
    p.add_argument("--sharding-types", type=_name_list, default=None, metavar="T1,T2",
                   help="sharding types the planner may choose among, e.g. table_wise to force an all-table-wise "
                        "plan (default: table_wise,row_wise,data_parallel)")
    p.add_argument("--drift-at", type=int, default=None, metavar="STEP",
                   help="from step STEP on, some features of the synthetic log carry --drift-factor ids per example "
                        "(as after a product launch): the start-up plan goes out of balance and the live reshard "
                        "has something to fix; `make demo` uses it (default: no drift)")
    p.add_argument("--drift-factor", type=int, default=d.drift_factor,
                   help="ids per example of a drifted feature (default %(default)s)")
    p.add_argument("--drift-features", type=_name_list, default=None, metavar="C3,C7",
                   help="the features that drift (default: C3,C7,C11,C15)")
    p.add_argument("--calibration", type=_calibration, default=None, metavar="FILE",
                   help="plan with these cost figures instead of measuring them at start-up: a metrics.json of an "
                        "earlier run or a Calibration JSON; the plan and the live reshard's decision are then the "
                        "same on every run, whatever the machine's load (default: measured on rank 0)")
    p.add_argument("--collective-timeout", type=float, default=d.collective_timeout,
                   help="seconds a collective waits for a missing rank before all ranks fail (default %(default)s)")


def config_from_args(ns: argparse.Namespace) -> TrainConfig:
    return TrainConfig(steps=ns.steps, batch_size=ns.batch_size, out=ns.out, reshard_at=ns.reshard_at,
                       reshard_min_window=ns.reshard_min_window,
                       checkpoint_every=ns.checkpoint_every, checkpoint_dir=ns.checkpoint_dir, resume=ns.resume,
                       data=ns.data, seed=ns.seed, dense_parallel=ns.dense_parallel,
                       compile_update=ns.compile_update, rows=ns.rows, dim=ns.dim,
                       memory_per_rank_mb=_memory_mb(ns), threads=ns.threads,
                       num_embeddings_per_feature=ns.num_embeddings_per_feature, max_rows=ns.max_rows,
                       eval_data=ns.eval_data, eval_fraction=ns.eval_fraction, eval_rows=ns.eval_rows, skip_bad_lines=ns.skip_bad_lines, device=ns.device, quiet=ns.quiet, collective_timeout=ns.collective_timeout,
                       sharding_types=ns.sharding_types, drift_at=ns.drift_at, drift_factor=ns.drift_factor,
                       drift_features=ns.drift_features, calibration=ns.calibration)


def _calibration(path: str) -> dict:
    from ..embedding.plan.calibration import Calibration

    try:
        raw = json.loads(Path(path).read_text())
        cal = Calibration.from_json(raw)
        if "source" not in raw.get("calibration", raw):   # say where figures without a source came from
            cal = dataclasses.replace(cal, source=f"read from {path}")
        return cal.to_json()
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{path!r}: {e}") from None


def _memory_mb(ns: argparse.Namespace):
    alias = getattr(ns, "memory_per_rank_mb_alias", None)
    return ns.memory_per_rank_mb if ns.memory_per_rank_mb is not None else alias


def memory_flag(ns: argparse.Namespace) -> str:
    """The memory flag as the user typed it (errors name that one)."""
    return "--memory-per-rank-mb" if getattr(ns, "memory_per_rank_mb_alias", None) is not None \
        and ns.memory_per_rank_mb is None else "--memory-per-rank"


def check_output_paths(cfg: TrainConfig) -> None:
    """Fail before the launch when the report or checkpoint folder cannot be written: otherwise the
    first checkpoint save, or the report at the very end, would throw the training away."""
    for flag, path in (("--out", cfg.out), ("--checkpoint-dir", cfg.checkpoint_path)):
        p = os.path.abspath(path)
        if os.path.exists(p) and not os.path.isdir(p):
            raise ValueError(f"{flag} {path!r} is a file, not a folder; pass a folder path (it is created "
                             f"if missing)")
        parent = p
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path!r}: {parent!r} is not a writable folder; pass a path you can "
                             f"write to")


def _init_process_group(timeout_s: float = 600.0, device_type: Optional[str] = None):
    """Join the group the launcher describes in the environment, on ``device_type`` (``cuda``: NCCL on
    ``cuda:LOCAL_RANK``; ``cpu``: gloo; None: :func:`~shardwise.train.launching.host.choose_device` for this
    machine). A rank that never joins a collective makes the others fail after ``timeout_s`` seconds
    instead of hanging."""
    from torch.distributed.device_mesh import init_device_mesh

    from .launching.host import choose_device, local_device

    if device_type is None:
        device_type = choose_device(None, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count())
    local_device(device_type)
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if restart and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # After an elastic restart the agent's store still holds the dead group's addresses under
            # the default keys, and the new group would dial them forever: give each attempt its prefix.
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  timeout=timedelta(minutes=10))
            dist.init_process_group(backend, store=dist.PrefixStore(f"shardwise/attempt{restart}", store),
                                    rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                    timeout=timedelta(seconds=timeout_s))
        else:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return init_device_mesh(device_type, (dist.get_world_size(),))


def _set_threads(cfg: TrainConfig, mesh) -> int:
    """Share the host's cores among the ranks on it (``--threads`` wins); collective."""
    from .launching.host import host_cores, ranks_on_this_host, threads_per_process

    device = torch.device(mesh.device_type, torch.cuda.current_device()) if mesh.device_type == "cuda" \
        else torch.device("cpu")
    here = ranks_on_this_host(device)   # every rank takes part, also when --threads makes it moot
    torch.set_num_threads(threads_per_process(host_cores(), here, cfg.threads))
    return here


def run_worker(config_json: str) -> Optional[dict]:
    """One rank: join the process group, train, leave. Returns rank 0's metrics (None elsewhere).

    This is the function ``elastic_launch`` runs, so it is module-level and takes plain JSON.
    """
    cfg = TrainConfig.from_json(config_json)
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and cfg.checkpoint_every:
        from .checkpoint import latest

        # the launcher restarted the group after a failure: continue from the last committed checkpoint
        cfg.resume = latest(cfg.checkpoint_path) is not None
    # import the job (and with it torch.distributed.nn) before the group exists: imported after, that
    # module's `group=WORLD` defaults keep the group alive past destroy_process_group, and its gloo
    # threads can then die at interpreter exit ("terminate called without an active exception")
    from .loop import Trainer

    mesh = _init_process_group(cfg.collective_timeout, cfg.device)
    try:
        here = _set_threads(cfg, mesh)
        return Trainer(cfg, mesh, ranks_on_host=here).run()
    finally:
        gc.collect()  # drop finished work objects that still hold the group's tensors
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardwise.train.worker",
                                description="One rank of the DLRM job; start it with torchrun.")
    add_train_arguments(p)
    cfg = config_from_args(p.parse_args(argv))
    if "RANK" not in os.environ:
        p.error("not launched by torchrun (no RANK in the environment); use `shardwise train` locally or "
                "`torchrun --nproc-per-node N -m shardwise.train.worker ...`")
    check_output_paths(cfg)
    from .launching.host import choose_device

    try:   # the same device on every rank of this machine, decided before the group starts
        cfg.device = choose_device(cfg.device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count())
    except ValueError as e:
        p.error(str(e))
    run_worker(cfg.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
