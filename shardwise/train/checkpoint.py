"""Atomic checkpoints with torch.distributed.checkpoint.

Layout: ``<dir>/step_00000040/`` holds the DCP files, ``meta.json`` (step, data cursor, plan,
metrics so far) and a ``COMMITTED`` marker. Every save goes to ``<dir>/.tmp-step_.../`` first; rank 0
writes the marker and renames the folder only after every rank finished writing, so a process killed
mid-save leaves a temp folder that :func:`latest` never returns (and the next save removes).

Example:
    >>> import tempfile, torch
    >>> ckpt, state = tempfile.TemporaryDirectory(), {"w": torch.arange(3.0)}   # state: every rank's part
    >>> save_checkpoint(ckpt.name, 40, state, {"cursor": 20480}).name
    'step_00000040'
    >>> path = latest(ckpt.name)
    >>> loaded = {"w": torch.zeros(3)}
    >>> load_checkpoint(path, loaded), loaded["w"]                 # the meta; the state filled in place
    ({'cursor': 20480}, tensor([0., 1., 2.]))
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

__all__ = ["save_checkpoint", "load_checkpoint", "latest", "read_meta", "resume_point", "fault_point"]

_NAME = re.compile(r"^step_(\d{8})$")
MARKER = "COMMITTED"


def fault_point(kind: str, step: int) -> None:
    """Fault injection for reliability tests: ``SHARDWISE_TRAIN_FAULT=KIND:STEP`` (``step:N`` = after
    training step N, ``save:N`` = after writing the step-N files, before the commit) kills the last rank
    at once, on the first attempt only (an elastic restart then runs clean)."""
    spec = os.environ.get("SHARDWISE_TRAIN_FAULT")
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    if spec == f"{kind}:{step}" and dist.is_initialized() and dist.get_rank() == dist.get_world_size() - 1:
        os._exit(17)   # like a kill: no cleanup, no exception handling


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(directory, step: int, state: dict, meta: dict) -> Path:
    """Collective: every rank calls it with its part of ``state``; returns the committed folder."""
    root = Path(directory)
    final, tmp = root / f"step_{step:08d}", root / f".tmp-step_{step:08d}"
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in [*root.glob(".tmp-step_*"), *root.glob(".old-step_*")]:   # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    dcp.save(state, checkpoint_id=str(tmp))
    fault_point("save", step)
    _barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True))
        with open(tmp / MARKER, "w") as fh:
            fh.write(f"{step}\n")
            fh.flush()
            os.fsync(fh.fileno())
        old = root / f".old-step_{step:08d}"
        if final.exists():
            # re-saving a step after a restart: move the old copy aside in one rename (deleting it in
            # place could be cut off, leaving a marked folder with files missing)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def latest(directory) -> Optional[Path]:
    """The newest committed checkpoint folder under ``directory``, or None."""
    root = Path(directory)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _NAME.match(p.name)) and (p / MARKER).is_file() and (p / "meta.json").is_file()]
    return max(found)[1] if found else None


def resume_point(cfg) -> Path:
    """The checkpoint ``--resume`` continues from; ValueError when there is none or it does not fit.

    Example:
        >>> from shardwise.train import TrainConfig
        >>> resume_point(TrainConfig(out="report", resume=True))       # after a run saved step 200  # doctest: +SKIP
        PosixPath('report/checkpoints/step_00000200')
        >>> resume_point(TrainConfig(out="no-such-run", resume=True))
        Traceback (most recent call last):
        ValueError: --resume: no committed checkpoint under 'no-such-run/checkpoints'; run without --resume first ...
    """
    path = latest(cfg.checkpoint_path)
    if path is None:
        raise ValueError(f"--resume: no committed checkpoint under {cfg.checkpoint_path!r}; run without "
                         f"--resume first (with --checkpoint-every K) or pass the --out of that run")
    meta = read_meta(path)
    saved = json.loads(meta["config"])
    # table shapes must match what was saved; batch size, dense mode and world size may change
    keys = ("rows", "dim", "num_embeddings_per_feature", "max_rows")
    if "table_sizes" in meta:   # saved with the sizes the job used: compare those, feature by feature
        from .sizes import job_tables, size_differences

        keys = ("dim",)
        now = job_tables(cfg).sizes
        if now != meta["table_sizes"]:
            raise ValueError(f"--resume: {path} was saved with other table sizes: "
                             f"{size_differences(meta['table_sizes'], now, 'saved', 'now')}; resume with the same "
                             f"--data/--num-embeddings-per-feature/--rows/--max-rows, or start a new run in another "
                             f"--out")
    from .sizes import DEMO_ROWS

    def flag(k: str, v):   # --rows left out: the synthetic log's default, which older runs saved as a number
        return (v or DEMO_ROWS) if k == "rows" and not cfg.data else v
    differ = [_differs(k, saved.get(k), getattr(cfg, k)) for k in keys
              if flag(k, saved.get(k)) != flag(k, getattr(cfg, k))]
    if differ:
        raise ValueError(f"--resume: {path} was saved with {', '.join(differ)}; resume with the same table "
                         f"sizes or start a new run in another --out")
    if "story" not in meta:
        raise ValueError(f"--resume: {path} was written by an older shardwise (its meta has no run story: segments, "
                         f"load windows, reshards); start a new run in another --out")
    return path


def _differs(key: str, saved, now) -> str:
    """One setting that differs; for the 26 table sizes, only the features that do."""
    flag = f"--{key.replace('_', '-')}"
    if key == "num_embeddings_per_feature" and saved and now and len(saved) == len(now):
        feats = [f"C{i + 1}: {a} (now {b})" for i, (a, b) in enumerate(zip(saved, now)) if a != b]
        more = f" and {len(feats) - 6} more" if len(feats) > 6 else ""
        return f"{flag} sizes that differ in {len(feats)} feature(s): {', '.join(feats[:6])}{more}"
    return f"{flag} {saved} (now {now})"


def read_meta(path) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


def load_checkpoint(path, state: dict) -> dict:
    """Collective: load ``path`` into ``state`` in place (any world size); returns its meta."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise ValueError(f"{path} is not a committed checkpoint (no {MARKER} marker); it was cut off mid-save. "
                         f"Resume from an older step_* folder or start without --resume")
    moved = _map_pre_zoo_dense(path, state)
    # fused-optimizer state saved under its older names (before TorchRec's <t>.momentum1) still loads
    from ..embedding.checkpoint import with_legacy_names

    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    dcp.load(with_legacy_names(state, saved), checkpoint_id=str(path))
    for section, new, old in moved:
        state["dense"][section][new] = state["dense"][section].pop(old)
    return read_meta(path)


def _map_pre_zoo_dense(path: Path, state: dict) -> list:
    """A checkpoint written before the job's dense part was built from the model zoo holds its
    parameters and Adam's state under the old names (``bottom.{2i}`` / ``top.{2i}``): point today's
    names at them for the load (renamed back after)."""
    dense = state.get("dense") if isinstance(state, dict) else None
    if not isinstance(dense, dict) or not isinstance(dense.get("params"), dict):
        return []
    from .model import pre_zoo_names

    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    moved = []
    for new, old in pre_zoo_names(list(dense["params"])).items():
        if f"dense.params.{new}" in saved or f"dense.params.{old}" not in saved:
            continue
        for section in ("params", "opt"):
            if new in (dense.get(section) or {}):
                dense[section][old] = dense[section].pop(new)
                moved.append((section, new, old))
    return moved
