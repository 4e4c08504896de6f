"""The job's 26 table sizes and how raw ids become rows: from the data where it says, else the flags.

- the synthetic log (no ``--data``): ``--num-embeddings-per-feature``, or 26 sizes spread below
  ``--rows`` (the demo's 100000 when not given);
- a categorified folder: the sizes in its manifest (each feature's vocabulary plus its rare/OOV row).
  ``--num-embeddings-per-feature`` must agree (refused naming the features that differ), ``--rows`` is
  refused (it shapes synthetic tables); ``--max-rows`` may still cap them (ids then fold);
- text logs and folders prepared without ``--categorify`` hold raw ids, folded by ``id % rows``: then
  ``--num-embeddings-per-feature`` or ``--rows`` is required (no silent demo sizes).

Example:
    >>> from shardwise.train import TrainConfig
    >>> job_tables(TrainConfig(rows=1000)).sizes[:4], job_tables(TrainConfig()).source
    ([8, 31, 119, 462], 'the synthetic log (--rows 100000)')
    >>> job_tables(TrainConfig(data="day_0.tsv"))
    Traceback (most recent call last):
    ValueError: --data day_0.tsv holds raw ids, folded into each table by id % rows: pass the table sizes ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["JobTables", "job_tables", "size_differences", "DEMO_ROWS"]

DEMO_ROWS = 100_000   # the largest synthetic table when --rows is not given


@dataclass
class JobTables:
    """``sizes`` (26 ints), where they came from (``source``), the training folder's vocabulary (None
    unless ``--data`` is a categorified folder) and whether raw ids fold by ``id % rows`` (``folded``)."""

    sizes: list
    source: str
    vocabulary: object = None
    folded: bool = False

    @property
    def vocab_digest(self) -> Optional[str]:
        return None if self.vocabulary is None else self.vocabulary.digest


def size_differences(have: Sequence[int], want: Sequence[int], have_name: str, want_name: str,
                     at_most: int = 6) -> str:
    """``"C3 (51901 in the data, 100 given), ..."`` for the features whose sizes differ ('' if none).

    Example:
        >>> size_differences([5, 6, 7], [5, 9, 7], "saved", "now")
        'C2 (6 saved, 9 now)'
    """
    diff = [f"C{j + 1} ({a} {have_name}, {b} {want_name})" for j, (a, b) in enumerate(zip(have, want)) if a != b]
    more = f" and {len(diff) - at_most} more" if len(diff) > at_most else ""
    return ", ".join(diff[:at_most]) + more


def job_tables(cfg) -> JobTables:
    """The table sizes of ``cfg``'s job (reads a prepared folder's manifest only); ValueError naming the
    flag and the fix when the flags and the data disagree or the sizes are not known."""
    from ..data import read_manifest
    from ..data.vocab import vocab_of_folder
    from .budget import table_sizes
    from .data import default_cardinalities

    given = cfg.num_embeddings_per_feature
    if not cfg.data:
        rows = cfg.rows or DEMO_ROWS
        sizes = table_sizes(default_cardinalities(rows), given, cfg.max_rows)
        return JobTables(sizes, "--num-embeddings-per-feature" if given else f"the synthetic log (--rows {rows})")
    paths = [p for p in cfg.data.split(",") if p]
    manifest = read_manifest(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else None
    if manifest is not None and manifest.get("categorified"):
        return _from_manifest(cfg, paths[0], manifest, vocab_of_folder(paths[0], manifest))
    if given is None and cfg.rows is None:
        what = " was prepared without --categorify, so it" if manifest is not None else ""
        raise ValueError(f"--data {cfg.data}{what} holds raw ids, folded into each table by id % rows: pass the "
                         f"table sizes (--num-embeddings-per-feature N1,...,N26, or --rows N for 26 sizes up to N), "
                         f"or categorify the files once (shardwise data prepare FILE... --out DIR --categorify, then "
                         f"--data DIR: the sizes come from the data)")
    sizes = table_sizes(default_cardinalities(cfg.rows) if given is None else given, given, cfg.max_rows)
    flag = "--num-embeddings-per-feature" if given else f"--rows {cfg.rows}"
    return JobTables(sizes, f"{flag} (raw ids fold by id % rows)", folded=True)


def _from_manifest(cfg, folder: str, manifest: dict, vocab) -> JobTables:
    sizes = list(manifest["table_sizes"])
    if cfg.rows is not None:
        raise ValueError(f"--rows {cfg.rows} shapes the synthetic log's tables; --data {folder} is categorified and "
                         f"its manifest gives the 26 table sizes: leave --rows out")
    given = cfg.num_embeddings_per_feature
    if given is not None and list(given) != sizes:
        raise ValueError(f"--num-embeddings-per-feature disagrees with the table sizes of --data {folder} (from its "
                         f"vocabulary): {size_differences(sizes, given, 'in the data', 'given')}; leave the flag out "
                         f"(the folder's sizes are the default) or prepare the data again")
    source = f"the manifest of {folder}"
    if cfg.max_rows:
        capped = [min(s, cfg.max_rows) for s in sizes]
        if capped != sizes:
            return JobTables(capped, f"{source}, capped at --max-rows {cfg.max_rows} (larger ones fold by id % rows)",
                             vocab, folded=True)
    return JobTables(sizes, source, vocab)
