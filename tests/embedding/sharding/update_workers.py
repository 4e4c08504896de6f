"""Rank functions for test_default_update.py (module level: the harness pickles them by name)."""

from __future__ import annotations

from shardwise.embedding.optim.rules import _RULES

from .. import workers


def train_with_compiled_default(rank, world, plan_names, cases):
    """``workers.train_all_plans``'s errors with every fused rule's default update compiled from any
    size (the test tables are far below the size where it compiles by itself), and which rules
    ran their compiled kernel."""
    saved = {r.name: r.update.compile_min_elements for r in _RULES.values()}
    for r in _RULES.values():
        r.update.compile_min_elements = 1
    try:
        errors = workers.train_all_plans(rank, world, 1, plan_names, cases)
    finally:
        for r in _RULES.values():
            r.update.compile_min_elements = saved[r.name]
    return errors, sorted(r.name for r in _RULES.values() if r.update._compiled is not None)
