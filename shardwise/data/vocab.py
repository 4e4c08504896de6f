r"""The vocabulary of a categorified folder: one mapping per feature, saved once, applied everywhere.

``shardwise data prepare --categorify`` counts the training files and saves, per feature, the raw ids
of the table's rows in row order (``vocab/C<k>.npy``, int64, most frequent first); the last row of
every table (``oov_rows[k]`` in the manifest, = the file's length) is shared by the ids seen fewer than
``--min-count`` times and by every id never seen. The manifest holds a digest of the files, so a
held-out folder, the job and an exported model can tell whether they use the *same* vocabulary:

- ``shardwise data prepare NEW --vocab TRAIN_DIR`` maps new files through the training vocabulary;
- ``shardwise train --data TRAIN_DIR --eval-data heldout.tsv`` applies it to the text file itself;
- ``shardwise export`` copies it next to the model, and ``shardwise predict`` applies it to raw lines.

Example:
    >>> v = Vocabulary([np.array([7, 3])] * 26)           # every feature: row 0 <- id 7, row 1 <- id 3
    >>> v.table_sizes[:2], v.apply(np.array([[3] * 26, [5] * 26]))[:, 0].tolist()   # 5 is unseen: OOV row 2
    ([3, 3], [1, 2])
    >>> import tempfile; folder = tempfile.mkdtemp(); info = v.save(folder)
    >>> Vocabulary.load(folder, info).digest == v.digest
    True
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .categorify import FeatureMapping

__all__ = ["Vocabulary", "VOCAB_DIR", "vocab_of_folder"]

VOCAB_DIR = "vocab"
_NUM_SPARSE = 26


def _names() -> list:
    return [f"C{i + 1}" for i in range(_NUM_SPARSE)]


class Vocabulary:
    r"""The 26 features' mappings (raw id -> row, unseen and rare ids -> the feature's last row).

    ``digest`` (sha256 of every feature's ids in row order) names the vocabulary: two folders with the
    same digest map every raw id to the same row.

    Example: see the module's.
    """

    def __init__(self, vocabs: Sequence[np.ndarray], rare_ids: Optional[Sequence[int]] = None,
                 min_count: int = 1, oov_rows: Optional[Sequence] = None):
        if len(vocabs) != _NUM_SPARSE:
            raise ValueError(f"a vocabulary needs {_NUM_SPARSE} features' ids (C1..C26), got {len(vocabs)}")
        rare = list(rare_ids) if rare_ids is not None else [0] * _NUM_SPARSE
        self.features = [FeatureMapping.from_vocab(v, r) for v, r in zip(vocabs, rare)]
        if oov_rows is not None:   # an older folder: no OOV row where it saw no rare id
            for m, row in zip(self.features, oov_rows):
                m.oov_row = row
        self.min_count = int(min_count)
        h = hashlib.sha256(b"shardwise-vocabulary-1")
        for name, m in zip(_names(), self.features):
            h.update(f"{name}:{len(m.vocab)}:{m.oov_row};".encode())
            h.update(m.vocab.astype("<i8").tobytes())
        self.digest = "sha256:" + h.hexdigest()

    @property
    def table_sizes(self) -> list:
        return [m.table_size for m in self.features]

    @property
    def oov_rows(self) -> list:
        return [m.oov_row for m in self.features]

    def apply(self, ids: np.ndarray) -> np.ndarray:
        """Raw ids [n, 26] (-1 = missing) -> rows [n, 26] (missing stays -1)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[1] != _NUM_SPARSE:
            raise ValueError(f"ids of shape {tuple(ids.shape)}: need [n, {_NUM_SPARSE}] raw ids (C1..C26)")
        out = np.empty_like(ids)
        for j, m in enumerate(self.features):
            out[:, j] = m.apply(ids[:, j])
        return out

    def oov_counts(self, rows: np.ndarray) -> np.ndarray:
        """Per feature: how many of ``rows`` (mapped ids [n, 26]) are the OOV row."""
        oov = np.asarray([-3 if r is None else r for r in self.oov_rows], dtype=np.int64)
        return (rows == oov).sum(axis=0)

    def save(self, folder) -> dict:
        """Write ``folder/vocab/C<k>.npy``; return the manifest's ``vocabulary`` entry."""
        d = Path(folder) / VOCAB_DIR
        d.mkdir(parents=True, exist_ok=True)
        for name, m in zip(_names(), self.features):
            np.save(d / f"{name}.npy", m.vocab)
        return {"digest": self.digest, "folder": VOCAB_DIR, "min_count": self.min_count, "oov_rows": self.oov_rows,
                "rare_ids": [m.rare_ids for m in self.features],
                "rule": "row = index of the raw id in vocab/<feature>.npy; any other id (seen fewer than min_count "
                        "times, or never seen) -> oov_rows[feature]; a missing id -> no row (empty bag)"}

    @classmethod
    def load(cls, folder, info: dict) -> "Vocabulary":
        """The vocabulary a manifest's ``vocabulary`` entry describes; ValueError when the files differ."""
        d = Path(folder) / info.get("folder", VOCAB_DIR)
        try:
            vocabs = [np.load(d / f"{name}.npy") for name in _names()]
        except OSError as e:
            raise ValueError(f"{str(d)!r}: cannot read the vocabulary ({e}); prepare the folder again") from None
        v = cls(vocabs, info.get("rare_ids"), info.get("min_count", 1), info.get("oov_rows"))
        if info.get("digest") and info["digest"] != v.digest:
            raise ValueError(f"{str(d)!r}: the vocabulary files do not match the manifest's digest {info['digest']} "
                             f"(they were changed after preparing); prepare the folder again")
        return v


def vocab_of_folder(folder, manifest: dict) -> Optional[Vocabulary]:
    """The vocabulary of a prepared folder: None when it was not categorified. A folder prepared before
    vocabularies had an OOV row for every feature loads too (its tables keep their sizes; ids it never
    saw cannot be mapped where it had no rare row)."""
    if not manifest.get("categorified"):
        return None
    info = manifest.get("vocabulary")
    if info is None:   # manifest version 1: vocab files, rare row only where rare ids were seen
        rare = manifest.get("rare_ids") or [0] * _NUM_SPARSE
        sizes = manifest["table_sizes"]
        oov = [s - 1 if r else None for s, r in zip(sizes, rare)]
        info = {"folder": VOCAB_DIR, "min_count": manifest.get("min_count") or 1, "rare_ids": rare, "oov_rows": oov}
    return Vocabulary.load(folder, info)
