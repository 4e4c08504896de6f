"""``shardwise data prepare IN [IN...] --out DIR``: click logs -> memory-mappable column files.

Example::

    shardwise data prepare day_0.tsv.gz day_1.tsv.gz --out prepared
    shardwise data prepare day_0.tsv.gz --out prepared --categorify --min-count 3
    shardwise data prepare day_1.tsv.gz --out heldout --vocab prepared     # the training vocabulary
"""

from __future__ import annotations

import resource
import sys

__all__ = ["add_data_commands", "run_data_command"]


def add_data_commands(subparsers) -> None:
    """Add ``data`` (with ``prepare``) to the ``shardwise`` subcommands; ``run_data_command`` runs it.

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser(); add_data_commands(p.add_subparsers(dest="command"))
        >>> p.parse_args(["data", "prepare", "day_0.tsv", "--out", "day0"]).out
        'day0'
    """
    d = subparsers.add_parser("data", help="prepare click logs for training (binary columns every rank maps)",
                              description="Work with Criteo-format click logs.")
    dsub = d.add_subparsers(dest="data_command", metavar="{prepare}")
    dsub.required = True
    p = dsub.add_parser("prepare", help="convert .tsv/.tsv.gz click logs into a prepared folder",
                        description="Stream Criteo-format files (label, I1-I13, C1-C26; .tsv or .tsv.gz) block by "
                                    "block into float32/int64 column files plus manifest.json; `--data DIR` then "
                                    "memory-maps them on every rank.")
    p.add_argument("inputs", nargs="+", metavar="IN", help="Criteo-format files, read in this order")
    p.add_argument("--out", required=True, metavar="DIR", help="new (or empty) folder for the prepared files")
    p.add_argument("--block-size", default="8MiB", metavar="SIZE",
                   help="bytes parsed per block, e.g. 8MiB or 1048576; bounds the memory used (default %(default)s)")
    p.add_argument("--categorify", action="store_true",
                   help="map each feature's ids to rows 0..K-1 by frequency and print the table sizes")
    p.add_argument("--min-count", type=int, default=1, metavar="N",
                   help="with --categorify: ids seen fewer than N times share the feature's rare/OOV row, with every "
                        "id never seen (default %(default)s)")
    p.add_argument("--vocab", default=None, metavar="PREPARED_DIR",
                   help="map the ids through the vocabulary of a folder prepared with --categorify (held-out or "
                        "later files of the same model: ids it never saw go to the OOV row)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip malformed lines and count them in the manifest instead of stopping at the first")
    p.set_defaults(handler=run_data_command)


def parse_size(text: str) -> int:
    """``"8MiB"`` -> 8388608; plain integers are bytes.

    Example:
        >>> parse_size("64KiB")
        65536
    """
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    t = str(text).strip().lower()
    for unit, scale in units.items():
        if t.endswith(unit) and t[:-len(unit)].strip().isdigit():
            return int(t[:-len(unit)]) * scale
    if t.isdigit():
        return int(t)
    raise ValueError(f"--block-size {text!r} is not a size; use bytes or a unit, e.g. 8MiB, 65536")


def run_data_command(ns) -> int:
    """Run ``shardwise data prepare`` from parsed arguments; ValueError for bad input (the CLI prints it)."""
    from .prepared import prepare

    if ns.min_count != 1 and not ns.categorify:
        raise ValueError(f"--min-count {ns.min_count} needs --categorify (it sets which ids share the rare row)")
    manifest = prepare(ns.inputs, ns.out, block_size=parse_size(ns.block_size), categorify=ns.categorify,
                       min_count=ns.min_count, skip_bad_lines=ns.skip_bad_lines, vocab=ns.vocab)
    rows, secs = manifest["rows"], manifest["seconds"]
    print(f"prepared {rows} rows from {len(manifest['sources'])} file(s) into {ns.out} in {secs:.1f} s "
          f"({rows / max(secs, 1e-9):,.0f} rows/s; peak RSS {_peak_rss_mib():.0f} MiB)")
    if manifest["bad_lines_skipped"]:
        print(f"skipped {manifest['bad_lines_skipped']} malformed line(s)")
    if manifest["table_sizes"]:
        sizes = ",".join(str(s) for s in manifest["table_sizes"])
        print(f"table sizes (C1..C26, min count {manifest['min_count']}; the last row of each is the rare/OOV "
              f"row): {sizes}")
        if ns.vocab:
            oov = manifest["oov_ids"]
            print(f"vocabulary of {ns.vocab} ({manifest['vocabulary']['digest'][:19]}...); ids it never saw (-> "
                  f"OOV row): {sum(oov)} in all, most in C{1 + max(range(len(oov)), key=oov.__getitem__)}")
            print(f"evaluate with: shardwise train --data {ns.vocab} --eval-data {ns.out}")
        else:
            print(f"train with: shardwise train --data {ns.out}   (table sizes read from its manifest)")
    sys.stdout.flush()
    return 0


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux reports KiB
