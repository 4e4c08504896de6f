r"""Real click logs: Criteo-format files read with pyarrow, and prepared binary columns.

- ``ClickLogReader``: ``.tsv``/``.tsv.gz`` files streamed in blocks; each rank parses only its
  stripes of the input (see ``split``); values and errors as ``shardwise.train.data.CriteoTSV``.
- ``prepare``: converts files once into memory-mappable column files (optionally categorified);
  ``PreparedClickLogs`` reads such a folder.
- ``open_click_logs``: a file, several files, or a prepared folder -> a reader with
  ``batch(start, count) -> ClickLogBatch`` over this rank's rows.
- ``AgreedReader``: wraps a reader so a bad line on one rank raises on every rank.
- ``criteo``: the schema (``ClickLogBatch``, the column names, ``parse_line``): ``shardwise.data``
  needs nothing from the training job.
- ``Vocabulary``: a categorified folder's raw id -> row mappings (unseen and rare ids -> each
  feature's rare/OOV row) and their digest, shared by training, evaluation and serving.

Example:
    >>> from shardwise.data import open_click_logs
    >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
    >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
    >>> # 4 lines of label, 13 counts, 26 hashed ids
    >>> data = open_click_logs([path, path], rank=0, world=2)   # files in order; rank 0 of 2
    >>> data.batch(0, 512).labels.shape                           # cycles over this rank's rows
    (512,)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence, Union

from .agree import AgreedReader
from .categorify import FeatureMapping, IdCounter
from .criteo import DENSE_NAMES, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES, ClickLogBatch, parse_line
from .prepared import PreparedClickLogs, prepare, read_manifest
from .reader import DEFAULT_BLOCK_SIZE, ClickLogReader, as_path_list
from .vocab import Vocabulary

__all__ = [
    "ClickLogReader", "PreparedClickLogs", "prepare", "read_manifest", "open_click_logs", "IdCounter",
    "FeatureMapping", "AgreedReader", "DEFAULT_BLOCK_SIZE", "Vocabulary", "ClickLogBatch", "parse_line",
    "NUM_DENSE", "NUM_SPARSE", "DENSE_NAMES", "SPARSE_NAMES",
]


def open_click_logs(paths: Union[str, os.PathLike, Sequence], rank: int = 0, world: int = 1, **options):
    r"""A reader for a Criteo-format file, several files (read in order), or a prepared folder.

    ``options`` (``block_size``, ``skip_bad_lines``, ``use_threads``, ``prefetch``) apply to text
    files; a prepared folder was checked when it was prepared and ignores them.

    Example:
        >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
        >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
        >>> open_click_logs(path).batch(0, 2).ids.shape     # a text file: streamed
        (2, 26)
        >>> _ = prepare([path], os.path.join(tmp.name, "prepared"))
        >>> open_click_logs(os.path.join(tmp.name, "prepared"), rank=1, world=2).num_rows   # rank 1's rows
        2
    """
    paths = as_path_list(paths)
    if len(paths) == 1 and Path(paths[0]).is_dir():
        return PreparedClickLogs(paths[0], rank, world)
    return ClickLogReader(paths, rank, world, **options)
