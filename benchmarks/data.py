"""Click-log reading: ``data prepare`` and the training-time readers against pyarrow's own read_csv.

On one Criteo-format file (or a generated 200k-line Criteo-like ``.tsv.gz``), in the same run:

- ``pyarrow_read_csv``: ``pyarrow.csv.read_csv`` of the file (tab-separated, types inferred, its
  default threads; and with one thread) — the raw parse, the floor for anything built on it;
- ``prepare``: ``shardwise.data.prepare`` of the file into a fresh folder (parse, convert, write);
- ``text_reader``: ``ClickLogReader`` (one rank of one) serving ``batch(start, 512)`` over the whole
  file, as the training job reads it;
- ``prepared_reader``: ``PreparedClickLogs`` serving the same batches from the memory-mapped folder.

Times are medians of rounds that run every variant once (rotating order, so background load hits
them alike); ratios are medians of per-round ratios. Peak RSS of ``prepare`` is measured in fresh
processes (VmHWM after the imports and after preparing), for two block sizes and for the file given
twice (twice the data): it follows the block size, not the file.

    python benchmarks/data.py                              # generated 200k-line .tsv.gz
    python benchmarks/data.py --file day_0.tsv.gz --reps 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _launch import emit  # noqa: E402

from shardwise.data import ClickLogReader, PreparedClickLogs, prepare  # noqa: E402

BATCH = 512


def generate(path: Path, lines: int, seed: int = 0) -> None:
    """Criteo-like lines: small skewed counts (10% missing), 8-digit hex ids (5% missing), 26% clicks."""
    rng = np.random.default_rng(seed)
    with gzip.open(path, "wt", compresslevel=6) as fh:
        for lo in range(0, lines, 20000):
            n = min(20000, lines - lo)
            labels = (rng.random(n) < 0.26).astype(int).astype(str)
            ints = np.floor(np.exp(rng.normal(1.5, 1.5, (n, 13)))).astype(np.int64).astype(str)
            ints[rng.random((n, 13)) < 0.1] = ""
            ids = np.char.mod("%08x", np.floor(np.exp(rng.random((n, 26)) * np.log(2**32))).astype(np.int64))
            ids[rng.random((n, 26)) < 0.05] = ""
            rows = np.concatenate([labels[:, None], ints, ids], axis=1)
            fh.write("".join("\t".join(r) + "\n" for r in rows.tolist()))


def time_pyarrow(path: Path, threads: bool) -> tuple[float, int]:
    t0 = time.perf_counter()
    table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(autogenerate_column_names=True, use_threads=threads),
                           parse_options=pacsv.ParseOptions(delimiter="\t"))
    return time.perf_counter() - t0, table.num_rows


def time_prepare(path: Path, out: Path, block: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    m = prepare([path], out, block_size=block)
    return time.perf_counter() - t0, m["rows"]


def time_reader(reader, rows: int) -> float:
    """Seconds to serve the whole file as batches of 512, in order (what a training rank asks for)."""
    t0 = time.perf_counter()
    for start in range(0, rows - BATCH + 1, BATCH):
        reader.batch(start, BATCH)
    return time.perf_counter() - t0


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from shardwise.data import prepare

def hwm_mib():   # VmHWM: this process image's peak RSS (ru_maxrss would carry the parent's over exec)
    for row in open("/proc/self/status"):
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024.0

before = hwm_mib()
prepare(json.loads(sys.argv[2]), sys.argv[3], block_size=int(sys.argv[4]))
print(json.dumps({"before": before, "after": hwm_mib()}))
"""


def child_peak_rss(files, out, block: int) -> tuple[float, float]:
    """Peak RSS (MiB) of a fresh process after its imports, and after it prepared ``files``."""
    root = str(Path(__file__).resolve().parent.parent)
    res = subprocess.run([sys.executable, "-c", _CHILD, root, json.dumps([str(f) for f in files]), str(out),
                          str(block)], capture_output=True, text=True, check=True)
    rec = json.loads(res.stdout.strip().splitlines()[-1])
    return rec["before"], rec["after"]


def measure_rounds(path: Path, tmp: Path, reps: int, block: int) -> dict:
    variants = ["pyarrow", "pyarrow_1thread", "prepare", "text_reader", "prepared_reader"]
    times = {v: [] for v in variants}
    prepared = tmp / "prepared_for_reader"
    rows = prepare([path], prepared, block_size=block)["rows"]   # warm-up and the folder the mmap reader reads
    for r in range(reps):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            if v == "pyarrow":
                times[v].append(time_pyarrow(path, True)[0])
            elif v == "pyarrow_1thread":
                times[v].append(time_pyarrow(path, False)[0])
            elif v == "prepare":
                times[v].append(time_prepare(path, tmp / f"p{r}", block)[0])
            elif v == "text_reader":
                reader = ClickLogReader(path, block_size=block)
                times[v].append(time_reader(reader, rows))
                reader.close()
            else:
                times[v].append(time_reader(PreparedClickLogs(prepared), rows))
    return {"rows": rows, "times": times}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=None, help="a Criteo-format .tsv or .tsv.gz (default: generated)")
    ap.add_argument("--lines", type=int, default=200_000, help="lines of the generated file (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3, help="rounds (default %(default)s)")
    ap.add_argument("--block-size", type=int, default=8 << 20, help="bytes per block (default %(default)s)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = args.file
        if path is None:
            path = tmp / "clicks.tsv.gz"
            generate(path, args.lines)
        res = measure_rounds(path, tmp, args.reps, args.block_size)
        rows, times = res["rows"], res["times"]
        med = {v: statistics.median(t) for v, t in times.items()}
        shape = {"file": path.name, "rows": rows, "bytes": path.stat().st_size, "block_size": args.block_size,
                 "cpus": os.cpu_count()}
        for v, s in med.items():
            emit({"bench": "data", "impl": v, **shape, "seconds": round(s, 3), "rows_per_s": round(rows / s)})
        rss = {}
        for label, files, block in (("block_1x", [path], args.block_size), ("block_4x", [path], 4 * args.block_size),
                                    ("block_1x_file_twice", [path, path], args.block_size)):
            rss[label] = child_peak_rss(files, tmp / f"rss_{label}", block)
        emit({"bench": "data", "impl": "prepare_peak_rss", **shape,
              "after_imports_mib": round(rss["block_1x"][0], 1),
              **{f"{k}_peak_mib": round(after, 1) for k, (_, after) in rss.items()},
              **{f"{k}_growth_mib": round(after - before, 1) for k, (before, after) in rss.items()}})

        def paired(a, b):
            return round(statistics.median(x / y for x, y in zip(times[a], times[b])), 3)
        emit({"bench": "data", "config": "ratios", **shape,
              "prepare_time_vs_pyarrow": paired("prepare", "pyarrow"),
              "prepare_time_vs_pyarrow_1thread": paired("prepare", "pyarrow_1thread"),
              "text_reader_time_vs_pyarrow_1thread": paired("text_reader", "pyarrow_1thread"),
              "prepared_reader_time_vs_pyarrow_1thread": paired("prepared_reader", "pyarrow_1thread"),
              "prepared_reader_us_per_batch": round(med["prepared_reader"] / (rows // BATCH) * 1e6, 1),
              "text_reader_us_per_batch": round(med["text_reader"] / (rows // BATCH) * 1e6, 1)})


if __name__ == "__main__":
    main()
