r"""Prepared click logs: binary columns written once by ``prepare``, memory-mapped by every rank.

A prepared folder holds ``dense.bin`` (float32 [n, 13]), ``ids.bin`` (int64 [n, 26], -1 = missing),
``labels.bin`` (float32 [n]), all raw little-endian C-order, and ``manifest.json`` (row counts,
sources, shapes, table sizes). The manifest is written last, so a folder whose preparation stopped
half way has none and is refused. With ``categorify=True`` the ids are rows of per-feature
tables (``vocab/C<k>.npy`` maps a row back to its raw id) and the manifest lists the table sizes.

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

from ..train.data import NUM_DENSE, NUM_SPARSE, SPARSE_NAMES, ClickLogBatch
from .categorify import IdCounter
from .reader import DEFAULT_BLOCK_SIZE, ClickLogReader, as_path_list, check_rank

__all__ = ["prepare", "PreparedClickLogs", "read_manifest", "MANIFEST", "FORMAT"]

MANIFEST, FORMAT = "manifest.json", "shardwise-click-log"
_COLUMNS = {"dense": ("float32", (NUM_DENSE,)), "ids": ("int64", (NUM_SPARSE,)), "labels": ("float32", ())}
_REWRITE_ROWS = 1 << 16


def prepare(inputs: Sequence, out, *, block_size: int = DEFAULT_BLOCK_SIZE, categorify: bool = False,
            min_count: int = 1, skip_bad_lines: bool = False, use_threads: bool = True,
            log: Optional[Callable[[str], None]] = None) -> dict:
    r"""Convert Criteo-format files into a prepared folder ``out``; return its manifest.

    The files are streamed block by block and appended to the column files, so memory stays bounded
    by ``block_size`` (plus, with ``categorify``, the distinct ids of each feature). ``out`` must not
    exist or be an empty folder.

    Example:
        >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
        >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
        >>> prepare([path, path], os.path.join(tmp.name, "prepared"))["rows"]
        8
    """
    if categorify and (not isinstance(min_count, int) or min_count < 1):
        raise ValueError(f"min_count={min_count!r} must be an int >= 1 (ids seen fewer times share one row)")
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
    try:
        rows_per_source = _write_columns(reader, out, counter)
    except BaseException:
        _remove_partial(out, created)   # so the same command can simply be run again
        raise
    n = sum(rows_per_source)
    if n == 0:
        _remove_partial(out, created)
        raise ValueError(f"{[str(s.path) for s in reader.sources]}: no examples (only blank or skipped lines); "
                         f"pass files with at least one line of Criteo data")
    manifest = {
        "format": FORMAT, "version": 1, "rows": n, "bad_lines_skipped": reader.bad_lines,
        "sources": [{"path": str(s.path.resolve()), "bytes": s.size, "rows": r}
                    for s, r in zip(reader.sources, rows_per_source)],
        "columns": {name: {"file": f"{name}.bin", "dtype": dt, "shape": [n, *shape]}
                    for name, (dt, shape) in _COLUMNS.items()},
        "categorified": bool(categorify), "min_count": min_count if categorify else None, "table_sizes": None,
    }
    if counter is not None:
        manifest.update(_categorify_ids(out, n, counter, min_count))
    manifest["seconds"] = round(time.perf_counter() - t0, 3)
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / MANIFEST)   # last: a folder with a manifest is complete
    if log is not None:
        log(f"{n} rows from {len(reader.sources)} file(s) into {out} in {manifest['seconds']} s")
    return manifest


def _write_columns(reader: ClickLogReader, out: Path, counter: Optional[IdCounter]) -> list:
    """Append every block to the column files; rows per source."""
    rows_per_source = [0] * len(reader.sources)
    files = {name: open(out / f"{name}.bin", "wb") for name in _COLUMNS}
    try:
        for k, b in reader.blocks():
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
    ids = np.memmap(out / "ids.bin", dtype=np.int64, mode="r+", shape=(n, NUM_SPARSE))
    for lo in range(0, n, _REWRITE_ROWS):
        block = np.array(ids[lo:lo + _REWRITE_ROWS])
        for j, m in enumerate(maps):
            block[:, j] = m.apply(block[:, j])
        ids[lo:lo + _REWRITE_ROWS] = block
    ids.flush()
    del ids
    (out / "vocab").mkdir()
    for name, m in zip(SPARSE_NAMES, maps):
        np.save(out / "vocab" / f"{name}.npy", m.vocab)
    return {"table_sizes": [m.table_size for m in maps], "rare_ids": [m.rare_ids for m in maps],
            "distinct_ids": [len(m.vocab) + m.rare_ids for m in maps]}


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
    if manifest.get("format") != FORMAT or manifest.get("version") != 1:
        raise ValueError(f"{str(path)!r} is not a version-1 {FORMAT} manifest; prepare the folder again with "
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
        >>> data.table_sizes[:3]             # one distinct id per feature in this file
        [1, 1, 1]
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
