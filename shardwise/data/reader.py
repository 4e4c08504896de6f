r"""``ClickLogReader``: Criteo-format text files streamed in blocks, one rank's rows, as ``ClickLogBatch``es.

Example:
    >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
    >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
    >>> data = ClickLogReader([path], rank=0, world=1)     # this rank of the job, the number of ranks
    >>> data.batch(0, 512).ids.shape
    (512, 26)
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from .criteo import ClickLogBatch
from .parse import ChunkOptions, parse_chunk
from .split import Source

__all__ = ["ClickLogReader", "DEFAULT_BLOCK_SIZE", "as_path_list", "check_rank"]

DEFAULT_BLOCK_SIZE = 8 << 20
_END = object()


def as_path_list(paths) -> list:
    """One path or a sequence of paths -> a non-empty list."""
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    out = list(paths)
    if not out:
        raise ValueError("no input files given; pass a Criteo-format file, several, or a prepared folder")
    return out


def check_rank(rank, world) -> None:
    for name, v in (("rank", rank), ("world", world)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{name}={v!r} must be an int")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank={rank}, world={world}: need world >= 1 and 0 <= rank < world "
                         f"(this process's rank in the job and the number of ranks)")


class ClickLogReader:
    r"""Criteo-format files (``.tsv``/``.tsv.gz``, in order) as this rank's endless stream of examples.

    The inputs are cut into stripes of ``block_size`` bytes dealt round-robin to the ranks (see
    ``shardwise.data.split``): a plain file is read only where this rank's stripes lie; a ``.gz`` is
    inflated by every rank, which tokenizes and converts only its own stripes' lines. Together the
    ranks read every line exactly once per pass; with ``world=1`` the stream is the files' lines in
    order, the same values as ``CriteoTSV``. ``batch(start, count)`` indexes this rank's rows and
    cycles when they run out; one block is parsed ahead on a helper thread (``prefetch``).

    A malformed line raises ``CriteoTSV``'s ValueError (file, line, field, fix) when the stream
    reaches it; with ``skip_bad_lines=True`` it is skipped and counted in ``bad_lines`` (lines of the
    first pass over the files; later passes repeat them).

    Example:
        >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
        >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
        >>> with open(path, "a") as f: _ = f.write("not a click log line\n")
        >>> r = ClickLogReader(path, rank=0, world=1, skip_bad_lines=True)
        >>> b = r.batch(0, 8); r.bad_lines
        1
    """

    def __init__(self, paths: Union[str, os.PathLike, Sequence], rank: int = 0, world: int = 1,
                 block_size: int = DEFAULT_BLOCK_SIZE, skip_bad_lines: bool = False, use_threads: bool = False,
                 prefetch: bool = True):
        check_rank(rank, world)
        if not isinstance(block_size, int) or block_size < 4096:
            raise ValueError(f"block_size={block_size!r} must be an int >= 4096 (bytes per stripe; "
                             f"default {DEFAULT_BLOCK_SIZE})")
        self.sources = [Source.open(p) for p in as_path_list(paths)]
        self.rank, self.world, self.block_size = rank, world, block_size
        self.opts = ChunkOptions(bool(skip_bad_lines), bool(use_threads))
        self.prefetch = bool(prefetch)
        self._check_enough_stripes()
        self.bad_lines = 0
        self._chunks_counted = 0               # chunks of a pass whose bad lines are in bad_lines
        self.num_rows: Optional[int] = None    # this rank's rows, known after the first full pass
        self._it: Optional[_Prefetch] = None
        self._cur: Optional[ClickLogBatch] = None
        self._cur_start = self._next_start = 0

    def _check_enough_stripes(self) -> None:
        """Plain inputs: every rank sees the same sizes, so all raise together when some rank gets nothing."""
        stripes = [s.plain_stripes(self.block_size) for s in self.sources]
        if None not in stripes and sum(stripes) < self.world:
            raise ValueError(f"{sum(stripes)} stripe(s) of block_size={self.block_size} bytes in "
                             f"{[str(s.path) for s in self.sources]} cannot feed {self.world} ranks (each rank "
                             f"reads whole stripes); pass a smaller block_size, use fewer ranks, or prepare the "
                             f"files with `shardwise data prepare` (ranks then split rows, not bytes)")

    def blocks(self, count_bad: bool = True) -> Iterator[tuple[int, ClickLogBatch]]:
        """One pass over this rank's rows: (index of the source file, ClickLogBatch) per parsed block."""
        first_stripe, ordinal = 0, 0
        for k, src in enumerate(self.sources):
            chunks = src.chunks(self.block_size, self.rank, self.world, first_stripe)
            # reading (and inflating) the next chunk overlaps parsing this one: zlib and file reads
            # release the GIL
            chunks = _Prefetch(chunks) if self.prefetch else _Plain(chunks)
            try:
                for chunk in chunks:
                    parsed = parse_chunk(chunk.data, src.path.name, self.opts, chunk.first_line)
                    # by the chunk's place in the pass: a restart before the first pass ends (a
                    # batch behind the current block) parses these chunks again, counted once
                    if count_bad and ordinal == self._chunks_counted:
                        self.bad_lines += parsed.bad_lines
                        self._chunks_counted += 1
                    ordinal += 1
                    if len(parsed.batch.labels):
                        yield k, parsed.batch
            finally:
                chunks.close()
            first_stripe += src.stripes_seen

    def batch(self, start: int, count: int) -> ClickLogBatch:
        """This rank's examples ``start .. start+count-1`` (cycling over its rows)."""
        if start < 0 or count < 1:
            raise ValueError(f"batch(start={start}, count={count}): need start >= 0 and count >= 1")
        parts, pos, left = [], start, count
        while left:
            if self.num_rows is not None:
                pos %= self.num_rows
            blk_start, blk = self._block_at(pos)
            if blk is None:
                continue   # a pass just ended: num_rows is known now and pos wraps
            off = pos - blk_start
            take = min(len(blk.labels) - off, left)
            parts.append((blk.dense[off:off + take], blk.ids[off:off + take], blk.labels[off:off + take]))
            pos, left = pos + take, left - take
        return ClickLogBatch(*(np.concatenate(x) for x in zip(*parts)))

    def _block_at(self, pos: int):
        cur = self._cur
        if cur is not None and self._cur_start <= pos < self._cur_start + len(cur.labels):
            return self._cur_start, cur
        if self._it is None or pos < self._cur_start:
            self._restart()
        while True:
            item = next(self._it, _END)
            if item is _END:
                self._end_of_pass()
                return 0, None
            self._cur, self._cur_start = item[1], self._next_start
            self._next_start += len(self._cur.labels)
            if pos < self._next_start:
                return self._cur_start, self._cur

    def _restart(self) -> None:
        self.close()
        gen = self.blocks(count_bad=self.num_rows is None)
        self._it = _Prefetch(gen) if self.prefetch else _Plain(gen)
        self._cur, self._cur_start, self._next_start = None, 0, 0

    def _end_of_pass(self) -> None:
        if self.num_rows is None:
            if self._next_start == 0:
                where = f"rank {self.rank} of {self.world}'s share of " if self.world > 1 else ""
                fix = ("; use fewer ranks, a smaller block_size, or `shardwise data prepare`" if self.world > 1
                       else "; pass files with at least one line of Criteo data")
                raise ValueError(f"{where}{[str(s.path) for s in self.sources]}: no examples (only blank or "
                                 f"skipped lines){fix}")
            self.num_rows = self._next_start
        self.close()

    def close(self) -> None:
        """Stop the prefetch thread (the reader restarts it when asked for more)."""
        if self._it is not None:
            self._it.close()
        self._it = None


class _Plain:
    def __init__(self, gen):
        self.gen = gen

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.gen)

    def close(self) -> None:
        self.gen.close()


class _Prefetch:
    """Parses the next block on one helper thread while the caller uses the current one (pyarrow and
    numpy release the GIL while they work)."""

    def __init__(self, gen):
        self.gen = gen
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="shardwise-data")
        self.fut = self.pool.submit(self._pull)

    def _pull(self):
        return next(self.gen, _END)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.fut.result()
        if item is _END:
            raise StopIteration
        self.fut = self.pool.submit(self._pull)
        return item

    def close(self) -> None:
        self.fut.cancel()
        self.pool.shutdown(wait=True)
        self.gen.close()
