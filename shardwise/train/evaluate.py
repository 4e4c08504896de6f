"""Scoring the held-out set at the end of the job: all of it, batched, every rank its own part.

Each rank reads only its share of the held-out rows (a prepared folder or a held-out fraction: a
contiguous range; text files: the rank's stripes, see ``shardwise.data.split``; the synthetic log: a
range of examples far beyond any training cursor) and scores it in batches of ``EVAL_BATCH`` rows.
The sharded lookup is a collective, so before each batch the ranks all-reduce the largest batch any
of them still has (and whether a read failed: then every rank raises the same error); a rank with
fewer rows pads with empty rows, which are dropped after. The AUC is exact: every rank's scores and
labels are gathered (one all-gather each) and ranked together (``shardwise.train.model.auc``).

``--eval-rows N`` caps the rows scored (the first N of a range; for text files each rank's first
N/world); the synthetic log, which never ends, scores 8192 rows unless told otherwise.

Which vocabulary the held-out ids go through (:func:`eval_vocabulary`): a job trained on a
categorified folder applies that folder's vocabulary to text or raw-id held-out data itself, takes a
held-out folder prepared with ``--vocab`` of the training folder (same digest) as it is, and refuses
a folder with another vocabulary, saying how to prepare it.

Example (inside the job, on every rank)::

    result = evaluate(trainer.sparse, trainer.dense, parts, trainer.cards, device)
    result.auc, result.rows
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

from .data import NUM_DENSE, NUM_SPARSE, ClickLogBatch, SyntheticClicks, to_model_inputs
from .synthetic.drift import DriftingClicks
from .model import auc

__all__ = ["EvalResult", "evaluate", "eval_vocabulary", "eval_parts", "held_out_parts", "SYNTHETIC_EVAL_ROWS", "EVAL_BATCH"]

EVAL_BATCH = 8192          # rows per rank per scoring call
SYNTHETIC_EVAL_ROWS = 8192  # the synthetic log never ends: rows scored unless --eval-rows says otherwise
_EVAL_START = 1 << 40   # synthetic eval examples come from far beyond any training cursor


@dataclass
class EvalResult:
    """``auc`` over ``rows`` scored rows (every rank's, exact); ``oov_ids``: held-out ids mapped to the
    OOV row by the training vocabulary (0 without one)."""

    auc: float
    rows: int
    oov_ids: int = 0


def eval_vocabulary(train_vocab, eval_path: Optional[str]):
    """The vocabulary the job must apply to ``eval_path``'s ids (None: use them as they are);
    ValueError when the held-out folder was mapped with another vocabulary, or with one the job's
    raw ids do not have.

    Example:
        >>> eval_vocabulary(None, None) is None     # the synthetic log: nothing to map
        True
    """
    if not eval_path:
        return None
    from ..data import read_manifest

    paths = [p for p in eval_path.split(",") if p]
    folder = paths[0] if len(paths) == 1 and Path(paths[0]).is_dir() else None
    manifest = read_manifest(folder) if folder else None
    categorified = bool(manifest and manifest.get("categorified"))
    if train_vocab is None:
        if categorified:
            raise ValueError(f"--eval-data {folder} was categorified (its ids are rows of its own vocabulary) but "
                             f"--data holds raw ids: evaluate raw files, or train on a categorified folder and "
                             f"prepare the held-out files with `shardwise data prepare FILE... --vocab TRAIN_DIR`")
        return None
    if not categorified:
        if None in train_vocab.oov_rows:
            raise ValueError(f"--data was prepared by an older shardwise, whose vocabulary has no out-of-vocabulary "
                             f"row for every feature, so --eval-data {eval_path} cannot be mapped through it; prepare "
                             f"the training files again with `shardwise data prepare ... --categorify`")
        return train_vocab   # raw ids: mapped by the job, as training's were
    digest = (manifest.get("vocabulary") or {}).get("digest")
    if digest != train_vocab.digest:
        raise ValueError(f"--eval-data {folder} was categorified with another vocabulary than --data (digest "
                         f"{str(digest)[:19]}..., training's {train_vocab.digest[:19]}...): its rows mean other ids. "
                         f"Prepare the held-out files through the training vocabulary: `shardwise data prepare "
                         f"FILE... --vocab TRAIN_DIR --out DIR`, or pass the .tsv/.tsv.gz files as --eval-data")
    return None   # already mapped through the same vocabulary


# ---- each rank's share of the held-out rows --------------------------------------------------------
def _range_parts(data, lo: int, hi: int, offset: int = 0) -> Iterator[ClickLogBatch]:
    for s in range(lo, hi, EVAL_BATCH):
        yield data.batch(offset + s, min(EVAL_BATCH, hi - s))


def eval_parts(data, eval_data, eval_paths: Optional[list], cap: Optional[int], rank: int, world: int,
               skip_bad_lines: bool) -> Iterator[ClickLogBatch]:
    """This rank's held-out batches (the job's ``--eval-data`` text files or folder, the synthetic log
    far beyond any training cursor, else the first rows of ``--data``)."""
    if eval_paths is not None:
        return text_parts(eval_paths, rank, world, cap, skip_bad_lines)
    if eval_data is not None:
        return held_out_parts(eval_data, rank, world, cap)
    if isinstance(data, (SyntheticClicks, DriftingClicks)):
        return held_out_parts(data, rank, world, cap or SYNTHETIC_EVAL_ROWS, offset=_EVAL_START)
    # no held-out set: the first rows of --data (trained on), once each: a folder shorter than the cap
    # is not read round again (its wrapped rows would be counted, and scored, twice)
    rows = cap or SYNTHETIC_EVAL_ROWS
    if hasattr(data, "__len__"):
        return held_out_parts(data, rank, world, min(rows, len(data)))
    n = max(rows // world, 1)
    return iter([data.batch(rank * n, n)])


def held_out_parts(data, rank: int, world: int, cap: Optional[int], offset: int = 0) -> Iterator[ClickLogBatch]:
    """This rank's contiguous share of rows ``[0, n)`` of ``data`` (``n``: its length, or ``cap``), in
    batches; ``data.batch(offset + i, count)`` reads row ``i``."""
    n = len(data) if hasattr(data, "__len__") else cap
    n = n if cap is None else min(n, cap)
    return _range_parts(data, rank * n // world, (rank + 1) * n // world, offset)


def text_parts(paths: list, rank: int, world: int, cap: Optional[int], skip_bad_lines: bool) -> Iterator[ClickLogBatch]:
    """This rank's stripes of held-out text files (every line scored once over all ranks), in batches,
    at most ``cap / world`` rows (rounded so the ranks' quotas add up to ``cap``)."""
    import os

    from ..data import ClickLogReader
    from ..data.reader import DEFAULT_BLOCK_SIZE

    total = sum(os.path.getsize(p) * (4 if str(p).endswith(".gz") else 1) for p in paths)
    # stripes small enough that every rank gets several, so the ranks share the work
    block = max(4096, min(DEFAULT_BLOCK_SIZE, total // (4 * world)))
    try:
        reader = ClickLogReader(paths, rank, world, block_size=block, skip_bad_lines=skip_bad_lines, prefetch=False)
    except ValueError:
        if total >= 4096 * world:
            raise
        # fewer stripes than ranks: rank 0 reads the little there is
        reader = ClickLogReader(paths, 0, 1, skip_bad_lines=skip_bad_lines, prefetch=False) if rank == 0 else None
    if reader is None:
        return
    quota = None if cap is None else cap // world + (rank < cap % world)
    try:
        for _, b in reader.blocks():
            for s in range(0, len(b.labels), EVAL_BATCH):
                take = min(EVAL_BATCH, len(b.labels) - s)
                if quota is not None:
                    take = min(take, quota)
                    quota -= take
                if take <= 0:
                    return
                yield ClickLogBatch(b.dense[s:s + take], b.ids[s:s + take], b.labels[s:s + take])
    finally:
        reader.close()


# ---- scoring ------------------------------------------------------------------------------------
def _padded(b: Optional[ClickLogBatch], rows: int) -> ClickLogBatch:
    """``b`` followed by empty rows (dense 0, every id missing) up to ``rows``."""
    have = 0 if b is None else len(b.labels)
    n = rows - have
    pad = ClickLogBatch(np.zeros((n, NUM_DENSE), np.float32), np.full((n, NUM_SPARSE), -1, np.int64),
                        np.zeros(n, np.float32))
    if b is None:
        return pad
    out = ClickLogBatch(*(np.concatenate([getattr(b, f), getattr(pad, f)]) for f in ("dense", "ids", "labels")))
    if hasattr(b, "extra"):   # a drifted synthetic batch: its padded rows have no extra ids either
        extra = np.concatenate([b.extra, np.full((n,) + b.extra.shape[1:], -1, np.int64)])
        return type(b)(out.dense, out.ids, out.labels, extra)
    return out


def _agree(count: int, error: Optional[str], device) -> int:
    """The largest count over the ranks; the same ValueError on every rank when any read failed."""
    t = torch.tensor([count, 0 if error is None else 1], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if int(t[1]):
        messages: list = [None] * dist.get_world_size()
        dist.all_gather_object(messages, error)
        detail = "; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)
        raise ValueError(f"reading the held-out data failed, so every rank stops here: {detail}")
    return int(t[0])


def _gather(t: torch.Tensor, device) -> torch.Tensor:
    """Every rank's 1-D ``t`` (of differing lengths), concatenated in rank order."""
    n = torch.tensor([t.numel()], dtype=torch.int64, device=device)
    counts = [torch.empty_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, n)
    most = max(int(c) for c in counts)
    out = [torch.empty(most, dtype=t.dtype, device=device) for _ in counts]
    dist.all_gather(out, torch.cat([t, t.new_zeros(most - t.numel())]))
    return torch.cat([o[:int(c)] for o, c in zip(out, counts)])


def evaluate(sparse, dense_runner, parts: Iterator[ClickLogBatch], cards, device, vocab=None,
             to_inputs=to_model_inputs) -> EvalResult:
    """Collective: score this rank's ``parts`` (after ``vocab`` when given) with the sharded tables and
    the dense runner; the AUC of every rank's rows together."""
    scores, labels, oov = [], [], 0
    parts = iter(parts)
    while True:
        b, error = None, None
        try:
            b = next(parts, None)
            if b is not None and vocab is not None:
                b = ClickLogBatch(b.dense, vocab.apply(b.ids), b.labels)
                oov += int(vocab.oov_counts(b.ids).sum())
        except ValueError as e:
            error = str(e)
        mine = 0 if b is None else len(b.labels)
        rows = _agree(mine, error, device)
        if rows == 0:
            break
        dense, kjt, y = to_inputs(_padded(b, rows), cards, device)
        with torch.no_grad():
            pooled = sparse(kjt).values()
        logits = dense_runner.predict(dense, pooled)
        scores.append(torch.sigmoid(logits[:mine]).float())
        labels.append(y[:mine])
    s = _gather(torch.cat(scores) if scores else torch.zeros(0, device=device), device)
    y = _gather(torch.cat(labels) if labels else torch.zeros(0, device=device), device)
    oov_t = torch.tensor([oov], dtype=torch.int64, device=device)
    dist.all_reduce(oov_t)
    return EvalResult(auc(s.cpu(), y.cpu()), int(s.numel()), int(oov_t.item()))
