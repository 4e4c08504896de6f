"""The per-rank split: rank r of N parses exactly the lines that start in its stripes."""

import gzip
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from shardwise.data import ClickLogReader
from shardwise.testing import run_on_ranks
from shardwise.train.data import CriteoTSV

from .common import line, write_log

BLOCK = 8192


def _owned_rows(paths, block, world):
    """Ground truth from the raw bytes: for each rank, the CriteoTSV rows of the lines whose first byte
    lies in a stripe s (counted across files) with s % world == rank."""
    owners = {r: {"ids": [], "dense": []} for r in range(world)}
    first_stripe = 0
    for p in paths:
        raw = p.read_bytes()
        ref = CriteoTSV(p)
        starts = [0] + [i + 1 for i in range(len(raw)) if raw[i:i + 1] == b"\n" and i + 1 < len(raw)]
        for row, start in enumerate(starts):     # every line of these files is a data line
            r = (first_stripe + start // block) % world
            owners[r]["ids"].append(ref.ids[row])
            owners[r]["dense"].append(ref.dense[row])
        first_stripe += math.ceil(len(raw) / block)
    return owners


def _rows(reader):
    blocks = [b for _, b in reader.blocks()]
    return np.concatenate([b.ids for b in blocks]), np.concatenate([b.dense for b in blocks])


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_reads_exactly_its_stripes(tmp_path, world):
    a = write_log(tmp_path / "a.tsv", 400, seed=11)
    b = write_log(tmp_path / "b.tsv", 250, seed=12)
    truth = _owned_rows([a, b], BLOCK, world)
    (tmp_path / "a.tsv.gz").write_bytes(gzip.compress(a.read_bytes()))
    seen = 0
    for rank in range(world):
        want_ids = np.stack(truth[rank]["ids"])
        for files in ([a, b], [tmp_path / "a.tsv.gz", b]):    # .gz: inflated by all, parsed by the owner
            ids, dense = _rows(ClickLogReader(files, rank=rank, world=world, block_size=BLOCK))
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(dense, np.stack(truth[rank]["dense"]))
        seen += len(want_ids)
    assert seen == 650


def test_a_line_longer_than_a_stripe(tmp_path):
    """Stripes holding no line start give nothing; the long line goes to the rank of the stripe where
    it starts (CriteoTSV accepts leading zeros, so a valid line can be this long)."""
    long_line = line(ints=["0" * 4200 + "7"] + ["1"] * 12)   # under Python's 4300-digit int() limit
    a = write_log(tmp_path / "a.tsv", 120, seed=13, extra={30: long_line, 31: long_line})
    truth = _owned_rows([a], 4096, 3)
    for rank in range(3):
        ids, dense = _rows(ClickLogReader(a, rank=rank, world=3, block_size=4096))
        np.testing.assert_array_equal(ids, np.stack(truth[rank]["ids"]))
        np.testing.assert_array_equal(dense, np.stack(truth[rank]["dense"]))


def _rank_rows(rank, world, paths, block):
    """On a real rank: read this rank's share; every rank checks the total with one all-reduce."""
    ids, _ = _rows(ClickLogReader(paths, rank=dist.get_rank(), world=dist.get_world_size(), block_size=block))
    total = torch.tensor([len(ids)])
    dist.all_reduce(total)
    return ids, int(total.item())


def test_ranks_in_processes_partition_the_file(tmp_path):
    a = write_log(tmp_path / "a.tsv.gz", 300, seed=14, gz=True)
    plain = tmp_path / "a.tsv"
    plain.write_bytes(gzip.decompress(a.read_bytes()))
    truth = _owned_rows([plain], BLOCK, 2)
    results = run_on_ranks(_rank_rows, 2, [str(a)], BLOCK, timeout=60)
    for rank, (ids, total) in enumerate(results):
        np.testing.assert_array_equal(ids, np.stack(truth[rank]["ids"]))
        assert total == 300
