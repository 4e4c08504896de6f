r"""``shardwise predict MODEL_DIR LOGS.tsv[.gz] --out FILE``: score raw click-log lines with an exported model.

Lines are read as in training (``shardwise.data``: pyarrow, block by block): labelled lines (40
fields) or unlabelled ones (39: the label left out; told apart by the first line). A malformed line
stops the run with its file, line and field, unless ``skip_bad_lines``: then it scores ``nan`` and is
counted, so the output keeps one score per example line, in input order (blank lines are not examples
and get none, as in training). With labels, the AUC of the scores is returned and printed.

Example:
    >>> result = predict_file("exported", ["day_1.tsv.gz"], out="scores.txt")     # doctest: +SKIP
    >>> result.auc, result.lines, result.bad_lines                                 # doctest: +SKIP
    (0.8013, 5000, 0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

__all__ = ["PredictResult", "predict_file", "score_lines"]

_BLOCK = 4 << 20
_LINE_START = re.compile(rb"(?m)^(?=[^\r\n])")


@dataclass
class PredictResult:
    """``scores`` (one per example line, nan for a skipped bad line), ``labels`` (None when the lines had
    none), ``auc`` (None without labels), ``bad_lines`` skipped."""

    scores: np.ndarray
    labels: Optional[np.ndarray]
    auc: Optional[float]
    bad_lines: int

    @property
    def lines(self) -> int:
        return len(self.scores)


def _labelled(src) -> bool:
    """Whether a file's lines carry a label: its first non-blank line has 40 fields (39: no label)."""
    import gzip

    opener = gzip.open if src.gzipped else open
    with opener(src.path, "rb") as fh:
        for raw in fh:
            if raw.strip():
                return raw.rstrip(b"\r\n").count(b"\t") + 1 != 39
    return True


def _bad_line_mask(data: bytes, name: str) -> np.ndarray:
    """Per example line of ``data`` (non-blank lines), whether it is malformed (the chunks that had any)."""
    from ..data.parse import explain_line

    bad = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        try:
            if explain_line(raw + b"\n", 0, name) is None:
                continue   # blank (tabs or spaces): not an example
            bad.append(False)
        except ValueError:
            bad.append(True)
    return np.asarray(bad, dtype=bool)


def _batches(paths: Sequence, skip_bad_lines: bool) -> Iterator[tuple]:
    """(parsed ClickLogBatch, mask of bad lines or None, labelled) per chunk of every file, in order."""
    from ..data.parse import ChunkOptions, parse_chunk
    from ..data.reader import as_path_list
    from ..data.split import Source

    opts = ChunkOptions(skip_bad_lines=skip_bad_lines)
    first_stripe = 0
    for path in as_path_list(paths):
        src = Source.open(path)
        labelled = _labelled(src)
        for chunk in src.chunks(_BLOCK, 0, 1, first_stripe):
            data = chunk.data if labelled else _LINE_START.sub(b"0\t", chunk.data)
            parsed = parse_chunk(data, src.path.name, opts, chunk.first_line)
            yield parsed.batch, (_bad_line_mask(data, src.path.name) if parsed.bad_lines else None), labelled
        first_stripe += src.stripes_seen


def score_lines(model, paths: Sequence, skip_bad_lines: bool = False) -> PredictResult:
    """Score every example line of ``paths`` with ``model`` (``shardwise.serve.load_model``)."""
    from ..train.model import auc
    import torch

    scores, labels, bad, has_labels = [], [], 0, True
    for batch, mask, labelled in _batches(paths, skip_bad_lines):
        has_labels &= labelled
        s = model.score(batch.dense, batch.ids) if len(batch.labels) else np.zeros(0, np.float32)
        if mask is not None:   # nan where a bad line was skipped: the output keeps the input's order
            full = np.full(len(mask), np.nan, dtype=np.float32)
            full[~mask] = s
            y = np.full(len(mask), np.nan, dtype=np.float32)
            y[~mask] = batch.labels
            s, bad = full, bad + int(mask.sum())
        else:
            y = batch.labels
        scores.append(s)
        labels.append(y)
    s = np.concatenate(scores) if scores else np.zeros(0, np.float32)
    y = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    if not has_labels:
        return PredictResult(s, None, None, bad)
    ok = ~np.isnan(s)
    value = auc(torch.from_numpy(s[ok]), torch.from_numpy(y[ok])) if ok.any() else float("nan")
    return PredictResult(s, y, value, bad)


def predict_file(model_dir, paths: Sequence, out=None, skip_bad_lines: bool = False) -> PredictResult:
    """Load the exported model in ``model_dir``, score ``paths`` and write one score per line to ``out``."""
    from . import load_model

    result = score_lines(load_model(model_dir), paths, skip_bad_lines)
    if out is not None:
        np.savetxt(out, result.scores, fmt="%.7g")
    return result
