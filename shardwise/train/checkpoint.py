"""Atomic checkpoints with torch.distributed.checkpoint.

Layout: ``<dir>/step_00000040/`` holds the DCP files, ``meta.json`` (step, data cursor, plan,
metrics so far) and a ``COMMITTED`` marker. Every save goes to ``<dir>/.tmp-step_.../`` first; rank 0
writes the marker and renames the folder only after every rank finished writing, so a process killed
mid-save leaves a temp folder that :func:`latest` never returns (and the next save removes).

Example:
    >>> save_checkpoint("ckpt", 40, state, {"cursor": 20480})      # doctest: +SKIP
    >>> path = latest("ckpt")                                      # doctest: +SKIP
    >>> meta = load_checkpoint(path, state)                        # doctest: +SKIP
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

__all__ = ["save_checkpoint", "load_checkpoint", "latest"]

_NAME = re.compile(r"^step_(\d{8})$")
MARKER = "COMMITTED"


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
        for stale in root.glob(".tmp-step_*"):   # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    dcp.save(state, checkpoint_id=str(tmp))
    _barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True))
        with open(tmp / MARKER, "w") as fh:
            fh.write(f"{step}\n")
            fh.flush()
            os.fsync(fh.fileno())
        if final.exists():   # re-saving a step after a restart: the old copy is replaced whole
            shutil.rmtree(final)
        os.replace(tmp, final)
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


def read_meta(path) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


def load_checkpoint(path, state: dict) -> dict:
    """Collective: load ``path`` into ``state`` in place (any world size); returns its meta."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise ValueError(f"{path} is not a committed checkpoint (no {MARKER} marker); it was cut off mid-save. "
                         f"Resume from an older step_* folder or start without --resume")
    dcp.load(state, checkpoint_id=str(path))
    return read_meta(path)
