"""``shardwise validate``: the command line of the rule checker (``checker.validate_rules``)."""

from __future__ import annotations

import argparse
import sys

from ..propagation.registry import registered_ops
from .checker import _check_sizes, validate_rules

__all__ = ["main"]


def _parse_meshes(text: str) -> tuple:
    meshes = []
    for part in (s.strip() for s in text.split(",")):
        if part:
            dims = tuple(int(d) for d in part.split("x"))
            meshes.append(dims[0] if len(dims) == 1 else dims)
    return _check_sizes(meshes)


def main(argv=None) -> int:
    """``shardwise validate``: print the report; exit status 1 when a rule fails, 2 on bad arguments.

    >>> main(["--op", "aten.t.default", "--world-sizes", "2,2x2", "--quiet"])  # doctest: +ELLIPSIS
    validated 1 ops on meshes [2, (2, 2)]: ... 0 failures, ...
    0
    """
    parser = argparse.ArgumentParser(prog="shardwise validate",
                                     description="Check sharding rules against full-tensor PyTorch.")
    parser.add_argument("--op", action="append", default=[], help="only ops whose name contains this")
    parser.add_argument("--world-sizes", default="2,3,4", help="comma-separated meshes: sizes, or shapes like 2x2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="print failures and the summary only")
    parser.add_argument("--simulate-collectives", action="store_true",
                        help="run kernels that issue collectives on thread ranks instead of skipping them")
    a = parser.parse_args(argv)
    try:
        sizes = _parse_meshes(a.world_sizes)
    except ValueError as e:
        print(f"--world-sizes {a.world_sizes!r}: {e}", file=sys.stderr)
        return 2
    ops = None
    if a.op:
        ops = [o for o in registered_ops() if any(s in str(o) for s in a.op)]
        if not ops:
            print(f"no registered op matches {a.op}; see shardwise.tensor.propagation.registered_ops()",
                  file=sys.stderr)
            return 2
    report = validate_rules(ops, sizes, a.seed, simulate_collectives=a.simulate_collectives)
    if a.quiet:
        print("\n".join([str(f) for f in report.failures] + [report.summary()]))
    else:
        print(report)
    return 0 if report.ok else 1

