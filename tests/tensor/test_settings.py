"""The core's settings travel with the call: a ``with`` block changes them for its own thread only, they
come back after the block, and a plan cached inside a block does not carry the setting outside it."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from shardwise.tensor import embedding_index_check, fast_path, gather_fallback, rank_checks
from shardwise.tensor.checks.agreement import checks_enabled
from shardwise.tensor.dispatch import GATHER_FALLBACK
from shardwise.tensor.callpath.fastpath import FAST_PATH
from shardwise.tensor.ops.nn.embedding import _CHECK
from shardwise.testing.harness import run_on_ranks, worker_mesh

_SETTINGS = [  # (context manager factory, reader, default)
    (embedding_index_check, lambda: _CHECK.enabled, True),
    (gather_fallback, GATHER_FALLBACK.get, False),
    (fast_path, FAST_PATH.get, True),
    (rank_checks, checks_enabled, False),
]


def _in_other_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    assert not t.is_alive()
    return out[0]


@pytest.mark.parametrize("setting,read,default", _SETTINGS)
def test_a_setting_changed_in_one_thread_is_not_seen_in_another(setting, read, default):
    assert read() is default
    entered, release = threading.Event(), threading.Event()
    seen_inside = []

    def holder():  # keeps the other value for as long as the main thread looks
        with setting(not default):
            seen_inside.append(read())
            entered.set()
            release.wait(10)
        seen_inside.append(read())

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert entered.wait(10)
        assert read() is default  # this thread never saw the holder's block
        assert _in_other_thread(read) is default  # nor does a third
    finally:
        release.set()
        t.join(10)
    assert seen_inside == [not default, default]  # the holder saw its own value, restored after
    with setting(not default):
        assert read() is (not default)
        assert _in_other_thread(read) is default  # a thread started inside the block starts from default
    assert read() is default


@pytest.mark.parametrize("setting", [s for s, _, _ in _SETTINGS])
def test_settings_take_only_booleans(setting):
    with pytest.raises(TypeError, match="pass True or False"):
        with setting(1):
            pass


def _while_another_thread_sets(switch, value, call, error) -> str:
    """The error ``call`` raises here (or "no error") while another thread holds ``switch(value)``."""
    t, release = _thread_holding(switch, value)
    try:
        call()
        return "no error"
    except error as e:
        return str(e)
    finally:
        release.set()
        t.join(10)


def _thread_holding(setting, value):
    """Start a thread that sits inside ``with setting(value):`` until the returned event is set."""
    entered, release = threading.Event(), threading.Event()

    def holder():
        with setting(value):
            entered.set()
            release.wait(30)

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert entered.wait(10)
    return t, release


def _no_rule_op(x):
    # an op no family covers (weight norm's fused kernel), so only the gather fallback runs it
    return torch.ops.aten._weight_norm_interface(x, x.sum(1, keepdim=True), 0)[0]


def other_threads_settings(rank, world):
    from shardwise.tensor import EmbeddingIndexError, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    w = distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])
    bad = distribute_tensor(torch.tensor([1, 6]), mesh, [Replicate()])
    a = distribute_tensor(torch.rand(4, 3) + 1, mesh, [Replicate()])
    # another thread switched its own check off: this one still raises
    return {"lookup": _while_another_thread_sets(embedding_index_check, False, lambda: F.embedding(bad, w),
                                                 EmbeddingIndexError),
            # no sharding rule, and the fallback is on only in the other thread
            "fallback": _while_another_thread_sets(gather_fallback, True, lambda: _no_rule_op(a),
                                                   NotImplementedError)}


def cached_fallback_plan(rank, world):
    """A plan made by the gather fallback (cached, and seen by the fast path) is refused outside the block."""
    import warnings

    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    full = torch.rand(4, 3, generator=torch.Generator().manual_seed(0)) + 1  # the same on every rank
    out = {}
    for name, pl in (("replicated", Replicate()), ("sharded", Shard(0))):
        a = distribute_tensor(full, mesh, [pl])
        with gather_fallback(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ok = [torch.allclose(_no_rule_op(a).full_tensor(), _no_rule_op(full)) for _ in range(3)]
        try:
            _no_rule_op(a)
            out[name] = (all(ok), "no error")
        except NotImplementedError as e:
            out[name] = (all(ok), str(e))
    return out


def test_other_threads_settings_do_not_apply_on_real_ranks():
    for r in run_on_ranks(other_threads_settings, 2):
        assert "id 6 is out of range" in r["lookup"], r
        assert "no sharding strategy" in r["fallback"] and "gather_fallback" in r["fallback"], r


def test_a_plan_cached_by_the_fallback_is_refused_outside_the_block():
    for r in run_on_ranks(cached_fallback_plan, 2):
        for name in ("replicated", "sharded"):
            ok, message = r[name]
            assert ok and "no sharding strategy" in message, (name, message)
