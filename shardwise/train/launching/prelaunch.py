"""Checks ``shardwise train`` runs before any worker starts: what would otherwise fail (or surprise)
only after the launch, with a traceback per rank.

- more processes than cores: a warning (each process then gets one thread and they take turns);
- ``--memory-per-rank``: the tables must fit, planned here with the planner's nominal figures; a
  refusal says what the tables need in all and names the flag as the user typed it;
- ``--resume``: the global batch of the saved run is kept; the per-process batch follows the new
  number of processes, or the resume is refused naming the nearest numbers that divide it.

Example:
    >>> resumed_batch(saved_global=512, world=4)
    128
    >>> resumed_batch(saved_global=512, world=3)
    Traceback (most recent call last):
    ValueError: --resume on 3 processes: the saved run's global batch of 512 examples per step does not split ...
"""

from __future__ import annotations

from typing import Optional

from ..config import TrainConfig

__all__ = ["resumed_batch", "cores_warning", "check_memory", "check_before_launch"]


def resumed_batch(saved_global: int, world: int) -> int:
    """Per-process batch that keeps ``saved_global`` examples per step on ``world`` processes (the loss
    curve and the learning rates stay those of the saved run); ValueError naming the nearest process
    counts that divide it."""
    if saved_global % world == 0:
        return saved_global // world
    divisors = [d for d in range(1, saved_global + 1) if saved_global % d == 0]
    below = max(d for d in divisors if d < world)
    above = min((d for d in divisors if d > world), default=None)
    near = f"{below} or {above}" if above is not None else str(below)
    raise ValueError(f"--resume on {world} processes: the saved run's global batch of {saved_global} examples per "
                     f"step does not split evenly over {world}; resume on {near} processes (--nproc-per-node), "
                     f"which keep it, or start a new run in another --out")


def cores_warning(processes: int, cores: int) -> Optional[str]:
    """A warning when this machine's processes outnumber its cores (None otherwise)."""
    if processes <= cores:
        return None
    return (f"warning: {processes} processes on {cores} core{'s' if cores != 1 else ''}: each gets one thread and "
            f"they take turns on the cores, so steps are slower than on {cores} process{'es' if cores != 1 else ''} "
            f"(--nproc-per-node {cores})")


def _tables(cfg: TrainConfig) -> list:
    from ..model import make_tables
    from ..sizes import job_tables

    return make_tables(job_tables(cfg).sizes, cfg.dim)   # the sizes the job will use (flags or the data)


def check_memory(cfg: TrainConfig, world: int, flag: str = "--memory-per-rank") -> None:
    """ValueError when the tables cannot be planned within ``cfg.memory_per_rank_mb`` per rank on
    ``world`` ranks: names ``flag`` and what the tables need in all (weights + Adagrad state)."""
    if cfg.memory_per_rank_mb is None:
        return
    from ...embedding import GreedyShardingPlanner, ShardingType
    from ...embedding.plan import ShardBox
    from ..config import JOB_SHARDING_TYPES

    tables = _tables(cfg)
    budget = int(cfg.memory_per_rank_mb * 2**20)
    types = [ShardingType(t) for t in cfg.sharding_types or JOB_SHARDING_TYPES]
    planner = GreedyShardingPlanner(world, budget, batch_size_per_rank=cfg.batch_size, ids_per_bag=1.0,
                                       sharding_types=types, memory_flag=flag)
    need = sum(planner.shard_bytes(t, ShardBox(t.name, 0, 0, t.num_embeddings, 0, t.embedding_dim))
               for t in tables)
    try:
        planner.plan(tables)
    except ValueError as e:
        least = -(-need // world)
        raise ValueError(f"{flag} {_mib(budget)}: the 26 tables need {_mib(need)} in all (weights + Adagrad "
                         f"state), {_mib(least)} per rank at the very least on {world} ranks; the planner found no "
                         f"layout: {str(e).split(';')[0]}. Raise {flag} (e.g. {flag} {_suggest(need, world)}), "
                         f"add processes, or shrink the tables (--rows, --max-rows)") from None


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _suggest(need: int, world: int) -> str:
    mib = -(-need * 3 // 2 // world // 2**20)   # half again the even share: room for uneven layouts
    return f"{mib}MiB"


def check_before_launch(cfg: TrainConfig, world: Optional[int], local_processes: int, cores: int,
                        memory_flag: str = "--memory-per-rank") -> list:
    """Run every check that does not need the workers; returns the warnings to print and may change
    ``cfg.batch_size`` (a resume keeps the saved global batch). ``world``: the job's number of
    processes when known before launch (one machine, or a fixed number of them), else None."""
    notes = [w for w in [cores_warning(local_processes, cores)] if w]
    if world is not None:
        check_memory(cfg, world, memory_flag)
    if cfg.resume and world is not None:
        from ..checkpoint import latest, read_meta
        import json

        meta = read_meta(latest(cfg.checkpoint_path))
        saved = json.loads(meta["config"])
        if "world" in meta:
            total = int(meta["world"]) * int(saved["batch_size"])
            per = resumed_batch(total, world)
            if per != cfg.batch_size:
                notes.append(f"--resume on {world} processes (saved on {meta['world']}): {per} examples per process "
                             f"and step, keeping the saved run's global batch of {total}")
            cfg.batch_size = per
    return notes
