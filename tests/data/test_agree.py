"""AgreedReader on real gloo ranks: a bad line in one rank's stripe stops every rank with its message."""

import numpy as np
import torch
import torch.distributed as dist

from shardwise.data import ClickLogReader
from shardwise.data.agree import AgreedReader
from shardwise.testing import run_on_ranks
from shardwise.train.data import CriteoTSV

from .common import line, write_log

BLOCK = 8192


def _read_all(rank, world, path, count):
    reader = AgreedReader(ClickLogReader(path, rank=dist.get_rank(), world=world, block_size=BLOCK),
                          device=torch.device("cpu"))
    try:
        return "ok", reader.batch(0, count).ids, reader.bad_lines
    except ValueError as e:
        return "error", str(e), None


def test_one_ranks_bad_line_stops_both_ranks(tmp_path):
    path = write_log(tmp_path / "a.tsv", 200, seed=31)
    raw = path.read_bytes()
    starts = [0] + [i + 1 for i, c in enumerate(raw[:-1]) if c == 0x0A]
    victim = next(k for k, s in enumerate(starts) if (s // BLOCK) % 2 == 1)   # first line of rank 1's stripes
    write_log(path, 200, seed=31, extra={victim: line(cats=["zz"] + ["a"] * 25)})
    want = None
    try:
        CriteoTSV(path)
    except ValueError as e:
        want = str(e)
    assert want and f"line {victim + 1}" in want
    results = run_on_ranks(_read_all, 2, str(path), 10_000, timeout=60)
    assert [r[0] for r in results] == ["error", "error"]
    assert results[0][1] == results[1][1]
    assert "failed on 1 of 2 rank(s)" in results[0][1] and f"rank 1: {want}" in results[0][1]


def test_clean_reads_pass_through(tmp_path):
    path = write_log(tmp_path / "b.tsv", 200, seed=32)
    results = run_on_ranks(_read_all, 2, str(path), 64, timeout=60)
    for rank, (status, ids, bad) in enumerate(results):
        assert status == "ok" and bad == 0
        np.testing.assert_array_equal(ids, ClickLogReader(path, rank=rank, world=2, block_size=BLOCK).batch(0, 64).ids)
