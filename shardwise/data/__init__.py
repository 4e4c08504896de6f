"""Real click logs: Criteo-format files read with pyarrow, and prepared binary columns.

- ``ClickLogReader``: ``.tsv``/``.tsv.gz`` files streamed in blocks; each rank parses only its
  stripes of the input (see ``split``); values and errors as ``shardwise.train.data.CriteoTSV``.
- ``prepare``: converts files once into memory-mappable column files (optionally categorified);
  ``PreparedClickLogs`` reads such a folder.
- ``open_click_logs``: a file, several files, or a prepared folder -> a reader with
  ``batch(start, count) -> Batch`` over this rank's rows.
- ``AgreedReader``: wraps a reader so a bad line on one rank raises on every rank.

Example:
    >>> from shardwise.data import open_click_logs
    >>> data = open_click_logs(["day_0.tsv.gz", "day_1.tsv.gz"], rank=0, world=2)   # doctest: +SKIP
    >>> data.batch(0, 512).labels.shape                                              # doctest: +SKIP
    (512,)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence, Union

from .agree import AgreedReader
from .categorify import FeatureMapping, IdCounter
from .prepared import PreparedClickLogs, prepare, read_manifest
from .reader import DEFAULT_BLOCK_SIZE, ClickLogReader, as_path_list

__all__ = [
    "ClickLogReader", "PreparedClickLogs", "prepare", "read_manifest", "open_click_logs", "IdCounter",
    "FeatureMapping", "AgreedReader", "DEFAULT_BLOCK_SIZE",
]


def open_click_logs(paths: Union[str, os.PathLike, Sequence], rank: int = 0, world: int = 1, **options):
    """A reader for a Criteo-format file, several files (read in order), or a prepared folder.

    ``options`` (``block_size``, ``skip_bad_lines``, ``use_threads``, ``prefetch``) apply to text
    files; a prepared folder was checked when it was prepared and ignores them.

    Example:
        >>> open_click_logs("prepared_day0", rank=1, world=2).num_rows          # doctest: +SKIP
        97500000
    """
    paths = as_path_list(paths)
    if len(paths) == 1 and Path(paths[0]).is_dir():
        return PreparedClickLogs(paths[0], rank, world)
    return ClickLogReader(paths, rank, world, **options)
