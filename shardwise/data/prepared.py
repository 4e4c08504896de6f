r"""Prepared click logs: binary columns written once by ``prepare``, memory-mapped by every rank.

A prepared folder holds ``dense.bin`` (float32 [n, 13]), ``ids.bin`` (int64 [n, 26], -1 = missing),
``labels.bin`` (float32 [n]), all raw little-endian C-order, and ``manifest.json`` (row counts,
sources, shapes, table sizes). The manifest is written last, so a folder whose preparation stopped
half way has none and is refused. With ``categorify=True`` the ids are rows of per-feature
tables (``vocab/C<k>.npy`` maps a row back to its raw id; the last row of each table is the rare/OOV
row, see ``shardwise.data.vocab``) and the manifest lists the table sizes and the vocabulary's digest.
``vocab=FOLDER`` maps the files through that categorified folder's vocabulary instead (held-out or
later data: the same rows as training, ids the training files never had in the OOV row).

Example:
    >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
    >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
    >>> manifest = prepare([path], os.path.join(tmp.name, "day0"), categorify=True, min_count=3)
    >>> data = PreparedClickLogs(os.path.join(tmp.name, "day0"), rank=0, world=2)
    >>> data.batch(0, 512).dense.shape
    (512, 13)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from .criteo import NUM_DENSE, NUM_SPARSE, ClickLogBatch
from .categorify import IdCounter
from .vocab import Vocabulary, vocab_of_folder
from .reader import DEFAULT_BLOCK_SIZE, ClickLogReader, as_path_list, check_rank

__all__ = ["prepare", "PreparedClickLogs", "read_manifest", "MANIFEST", "FORMAT"]

MANIFEST, FORMAT = "manifest.json", "shardwise-click-log"
_COLUMNS = {"dense": ("float32", (NUM_DENSE,)), "ids": ("int64", (NUM_SPARSE,)), "labels": ("float32", ())}
_REWRITE_ROWS = 1 << 16


def prepare(inputs: Sequence, out, *, block_size: int = DEFAULT_BLOCK_SIZE, categorify: bool = False,
            min_count: int = 1, skip_bad_lines: bool = False, use_threads: bool = True,
            log: Optional[Callable[[str], None]] = None, vocab=None) -> dict:
    r"""Convert Criteo-format files into a prepared folder ``out``; return its manifest.

    The files are streamed block by block and appended to the column files, so memory stays bounded
    by ``block_size`` (plus, with ``categorify``, the distinct ids of each feature). ``out`` must not
    exist or be an empty folder. ``vocab`` (a folder prepared with ``categorify=True``) maps the ids
    through that folder's vocabulary: use it for held-out and later files of the same model.

    Example:
        >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
        >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
        >>> prepare([path, path], os.path.join(tmp.name, "prepared"))["rows"]
        8
    """
    if categorify and (not isinstance(min_count, int) or min_count < 1):
        raise ValueError(f"min_count={min_count!r} must be an int >= 1 (ids seen fewer times share one row)")
    source_vocab = _vocab_to_apply(vocab, categorify, min_count)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty folder; pass a new folder (preparing "
                         f"never overwrites files)")
    reader = ClickLogReader(as_path_list(inputs), block_size=block_size, skip_bad_lines=skip_bad_lines,
                            use_threads=use_threads)   # checks every input before anything is written
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    counter = IdCounter(NUM_SPARSE) if categorify else None
    oov = np.zeros(NUM_SPARSE, np.int64)
    try:
        rows_per_source = _write_columns(reader, out, counter, source_vocab, oov)
    except BaseException:
        _remove_partial(out, created)   # so the same command can simply be run again
        raise
    n = sum(rows_per_source)
    if n == 0:
        _remove_partial(out, created)
        raise ValueError(f"{[str(s.path) for s in reader.sources]}: no examples (only blank or skipped lines); "
                         f"pass files with at least one line of Criteo data")
    manifest = {
        "format": FORMAT, "version": 2, "rows": n, "bad_lines_skipped": reader.bad_lines,
        "sources": [{"path": str(s.path.resolve()), "bytes": s.size, "rows": r}
                    for s, r in zip(reader.sources, rows_per_source)],
        "columns": {name: {"file": f"{name}.bin", "dtype": dt, "shape": [n, *shape]}
                    for name, (dt, shape) in _COLUMNS.items()},
        "categorified": bool(categorify), "min_count": min_count if categorify else None, "table_sizes": None,
    }
    if counter is not None:
        manifest.update(_categorify_ids(out, n, counter, min_count))
    elif source_vocab is not None:
        info = source_vocab.save(out)
        manifest.update({"categorified": True, "min_count": source_vocab.min_count, "vocabulary": info,
                         "table_sizes": source_vocab.table_sizes, "vocab_from": str(Path(vocab).resolve()),
                         "oov_ids": oov.tolist()})
    manifest["seconds"] = round(time.perf_counter() - t0, 3)
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / MANIFEST)   # last: a folder with a manifest is complete
    if log is not None:
        log(f"{n} rows from {len(reader.sources)} file(s) into {out} in {manifest['seconds']} s")
    return manifest


def _vocab_to_apply(vocab, categorify: bool, min_count: int) -> Optional[Vocabulary]:
    """The vocabulary ``prepare(vocab=...)`` applies, checked before anything is written."""
    if vocab is None:
        return None
    if categorify or min_count != 1:
        raise ValueError("--vocab maps the files through an existing vocabulary, --categorify/--min-count build a "
                         "new one: pass --vocab alone (held-out or later data) or --categorify (training data)")
    v = vocab_of_folder(vocab, read_manifest(vocab))
    if v is None:
        raise ValueError(f"--vocab {str(vocab)!r} was not categorified, so it has no vocabulary; pass the folder "
                         f"prepared from the training files with `shardwise data prepare ... --categorify`")
    if None in v.oov_rows:
        raise ValueError(f"--vocab {str(vocab)!r} was prepared by an older shardwise, whose vocabulary has no "
                         f"out-of-vocabulary row for every feature; prepare the training files again with "
                         f"`shardwise data prepare ... --categorify`")
    return v


def _write_columns(reader: ClickLogReader, out: Path, counter: Optional[IdCounter],
                   vocab: Optional[Vocabulary] = None, oov: Optional[np.ndarray] = None) -> list:
    """Append every block to the column files (ids through ``vocab`` when given); rows per source."""
    rows_per_source = [0] * len(reader.sources)
    files = {name: open(out / f"{name}.bin", "wb") for name in _COLUMNS}
    try:
        for k, b in reader.blocks():
            if vocab is not None:
                b.ids = vocab.apply(b.ids)
                oov += vocab.oov_counts(b.ids)
            for name, fh in files.items():
                fh.write(np.ascontiguousarray(getattr(b, name)).data)
            rows_per_source[k] += len(b.labels)
            if counter is not None:
                counter.add(b.ids)
    finally:
        for fh in files.values():
            fh.close()
        reader.close()
    return rows_per_source


def _remove_partial(out: Path, created: bool) -> None:
    for name in _COLUMNS:
        (out / f"{name}.bin").unlink(missing_ok=True)
    if created:
        out.rmdir()


def _categorify_ids(out: Path, n: int, counter: IdCounter, min_count: int) -> dict:
    """Rewrite ids.bin in place with each feature's rows; save the vocabularies."""
    maps = counter.mapping(min_count)
    vocab = Vocabulary([m.vocab for m in maps], [m.rare_ids for m in maps], min_count)
    ids = np.memmap(out / "ids.bin", dtype=np.int64, mode="r+", shape=(n, NUM_SPARSE))
    for lo in range(0, n, _REWRITE_ROWS):
        block = np.array(ids[lo:lo + _REWRITE_ROWS])
        for j, m in enumerate(maps):
            block[:, j] = m.apply(block[:, j])
        ids[lo:lo + _REWRITE_ROWS] = block
    ids.flush()
    del ids
    info = vocab.save(out)
    return {"table_sizes": vocab.table_sizes, "rare_ids": [m.rare_ids for m in maps],
            "distinct_ids": [len(m.vocab) + m.rare_ids for m in maps], "vocabulary": info}


def read_manifest(folder) -> dict:
    """The manifest of a prepared folder; ValueError naming the folder and the fix when there is none.

    Example (a folder :func:`prepare` wrote returns what it returned):
        >>> read_manifest("no-such-folder")
        Traceback (most recent call last):
        ValueError: 'no-such-folder' is a folder without prepared click logs (no manifest.json); ...
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ValueError(f"{str(folder)!r} is a folder without prepared click logs (no {MANIFEST}); run "
                         f"`shardwise data prepare FILE... --out {folder}` first, or pass the .tsv/.tsv.gz files")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{str(path)!r} is not valid JSON ({e}); prepare the folder again") from None
    # version 1 (before vocabularies had a digest and an OOV row per feature) still loads
    if manifest.get("format") != FORMAT or manifest.get("version") not in (1, 2):
        raise ValueError(f"{str(path)!r} is not a version-1 or -2 {FORMAT} manifest; prepare the folder again with "
                         f"`shardwise data prepare`")
    return manifest


class PreparedClickLogs:
    r"""A prepared folder, memory-mapped; ``batch(start, count)`` over this rank's rows, cycling.

    Rank ``r`` of ``world`` owns the contiguous rows ``[r*n//world, (r+1)*n//world)`` (with
    ``world=1``, all rows: then global indices work, and each rank's reads touch only the pages it
    asks for). Only the rows asked for are copied out of the map.

    Example:
        >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
        >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
        >>> _ = prepare([path], os.path.join(tmp.name, "day0"), categorify=True)
        >>> data = PreparedClickLogs(os.path.join(tmp.name, "day0"))
        >>> data.table_sizes[:3]             # one distinct id per feature in this file, and the OOV row
        [2, 2, 2]
    """

    def __init__(self, folder, rank: int = 0, world: int = 1):
        check_rank(rank, world)
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        n = int(self.manifest["rows"])
        self._cols = {}
        for name, (dt, shape) in _COLUMNS.items():
            path = self.folder / f"{name}.bin"
            want = n * int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            if not path.is_file() or path.stat().st_size != want:
                raise ValueError(f"{str(path)!r}: missing or not {want} bytes as the manifest says ({n} rows); "
                                 f"prepare the folder again")
            self._cols[name] = np.memmap(path, dtype=dt, mode="r", shape=(n, *shape))
        self.lo, self.hi = rank * n // world, (rank + 1) * n // world
        if self.hi == self.lo:
            raise ValueError(f"{str(self.folder)!r} has {n} rows, fewer than world={world} ranks; use fewer ranks "
                             f"or more data")
        self.rank, self.world = rank, world
        self.bad_lines = int(self.manifest.get("bad_lines_skipped", 0))
        self.table_sizes: Optional[list] = self.manifest.get("table_sizes")

    @property
    def vocabulary(self) -> Optional[Vocabulary]:
        """The folder's vocabulary (None when it was not categorified); see ``shardwise.data.vocab``."""
        return vocab_of_folder(self.folder, self.manifest)
    @property
    def num_rows(self) -> int:
        """This rank's rows."""
        return self.hi - self.lo

    def __len__(self) -> int:
        return self.num_rows

    def batch(self, start: int, count: int) -> ClickLogBatch:
        """This rank's examples ``start .. start+count-1`` (cycling over its rows)."""
        if start < 0 or count < 1:
            raise ValueError(f"batch(start={start}, count={count}): need start >= 0 and count >= 1")
        m = self.num_rows
        s = start % m
        if s + count <= m:   # one slice: a plain copy out of the map
            sl = slice(self.lo + s, self.lo + s + count)
            return ClickLogBatch(*(np.array(self._cols[c][sl]) for c in ("dense", "ids", "labels")))
        idx = self.lo + (np.arange(start, start + count) % m)
        return ClickLogBatch(*(np.asarray(self._cols[c][idx]) for c in ("dense", "ids", "labels")))
