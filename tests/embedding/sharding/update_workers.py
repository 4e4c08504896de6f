"""Rank functions for test_default_update.py (module level: the harness pickles them by name)."""

from __future__ import annotations

from shardwise.embedding.optim import row_update
from shardwise.embedding.optim.rules import _RULES

from .. import workers


def train_with_compiled_default(rank, world, plan_names, cases):
    """``workers.train_all_plans``'s errors twice, with the test tables (far below the sizes where
    the compiled kernel runs by itself) taken for large ones: (1) every fused rule's default update
    compiled from any call size, (2) shard() building stores that call the compiled kernel directly
    (``store_compiles``). Returns both runs' errors, which rules compiled, and whether every store of
    run (2) held the compiled kernel."""
    from shardwise.embedding.sharding import store as store_mod

    saved = {r.name: r.update.compile_min_elements for r in _RULES.values()}
    saved_store, saved_init = row_update.STORE_COMPILE_MIN_ELEMENTS, store_mod.ShardStore.__init__
    kernels = []

    def spy(self, *args, **kwargs):   # record whether shard() asked each store for the compiled kernel
        saved_init(self, *args, **kwargs)
        kernels.append(self.kernel is not None)

    try:
        for r in _RULES.values():
            r.update.compile_min_elements = 1
        by_update = workers.train_all_plans(rank, world, 1, plan_names, cases)
        for r in _RULES.values():
            r.update.compile_min_elements = saved[r.name]
        row_update.STORE_COMPILE_MIN_ELEMENTS = 1
        store_mod.ShardStore.__init__ = spy
        by_store = workers.train_all_plans(rank, world, 1, plan_names, cases)
    finally:
        for r in _RULES.values():
            r.update.compile_min_elements = saved[r.name]
        row_update.STORE_COMPILE_MIN_ELEMENTS = saved_store
        store_mod.ShardStore.__init__ = saved_init
    compiled = sorted(r.name for r in _RULES.values() if r.update._compiled is not None)
    return by_update, by_store, compiled, bool(kernels) and all(kernels)
