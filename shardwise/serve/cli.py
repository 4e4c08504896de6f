"""``shardwise export`` and ``shardwise predict``: a trained model out of the job, and raw logs scored with it.

Example::

    shardwise export shardwise-report --out exported
    shardwise predict exported day_1.tsv.gz --out scores.txt
"""

from __future__ import annotations

import sys

__all__ = ["add_serve_commands"]


def add_serve_commands(subparsers) -> None:
    """Add ``export`` and ``predict`` to the ``shardwise`` subcommands (handlers ride on the namespace).

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser(); add_serve_commands(p.add_subparsers(dest="command"))
        >>> p.parse_args(["predict", "exported", "day_1.tsv", "--out", "scores.txt"]).logs
        ['day_1.tsv']
    """
    e = subparsers.add_parser("export", help="write a trained job's model unsharded, with its vocabulary",
                              description="Read the job's sharded checkpoint with torch.distributed.checkpoint on "
                                          "one process and write model.pt (a plain state dict), model.py (the "
                                          "module definition, plain PyTorch), model.json and the training "
                                          "vocabulary: loadable without shardwise or a process group.")
    e.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                   help="a run's --out folder, its checkpoint folder, or one step_* checkpoint")
    e.add_argument("--out", required=True, metavar="DIR", help="new (or empty) folder for the exported model")
    e.add_argument("--vocab", default=None, metavar="PREPARED_DIR",
                   help="the prepared training folder, when it is no longer where the run read it")
    e.add_argument("--int8", action="store_true",
                   help="store the tables row-wise quantized (uint8 and a float scale and bias per row: a quarter "
                        "of the bytes, dequantized per looked-up row on the CPU); the MLPs stay float32")
    e.set_defaults(handler=_run_export)
    p = subparsers.add_parser("predict", help="score raw click-log lines with an exported model",
                              description="Score Criteo-format lines (labelled: 40 fields, or unlabelled: 39) with "
                                          "a model written by `shardwise export`: one score per example line, in "
                                          "input order; the AUC when the lines are labelled.")
    p.add_argument("model", metavar="MODEL_DIR", help="a folder written by `shardwise export`")
    p.add_argument("logs", nargs="+", metavar="LOGS", help=".tsv or .tsv.gz files, scored in this order")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write the scores, one per line")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="score malformed lines as nan (and count them) instead of stopping at the first")
    p.set_defaults(handler=_run_predict)


def _run_export(ns) -> int:
    from .export import export_model

    spec = export_model(ns.source, ns.out, vocab=ns.vocab, int8=ns.int8)
    ids = f"vocabulary {spec['vocab_digest'][:19]}..." if spec["ids"] == "vocabulary" else "raw ids folded by id % rows"
    print(f"exported step {spec['step']} of {spec['checkpoint']} to {ns.out}: 26 tables "
          f"({sum(spec['table_sizes'])} rows x {spec['dim']}, {spec['table_dtype']}), {ids}")
    print(f"score with: shardwise predict {ns.out} LOGS.tsv --out scores.txt  (or load {ns.out}/model.py)")
    return 0


def _run_predict(ns) -> int:
    from pathlib import Path

    from .predict import predict_file

    if not (Path(ns.model) / "model.json").is_file():
        raise ValueError(f"{ns.model!r} is not an exported model (no model.json); make one with "
                         f"`shardwise export RUN --out {ns.model}`")
    r = predict_file(ns.model, ns.logs, out=ns.out, skip_bad_lines=ns.skip_bad_lines)
    print(f"scored {r.lines} line(s) into {ns.out}" + (f"; skipped {r.bad_lines} malformed line(s) (scored nan)"
                                                       if r.bad_lines else ""))
    if r.auc is not None:
        print(f"AUC {r.auc:.4f} over {r.lines - r.bad_lines} labelled line(s)")
    sys.stdout.flush()
    return 0
