"""Prefetched: the helper thread hands out the source's items in order, raises the source's error
where it happened, stops when closed; the synthetic log read through it is the same data."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from shardwise.train.data import SyntheticClicks, default_cardinalities
from shardwise.train.prefetch import Prefetched


def test_items_in_order_and_end():
    it = Prefetched(iter(range(50)), depth=2)
    assert list(it) == list(range(50))
    with pytest.raises(StopIteration):
        next(it)
    it.close()


def test_source_error_is_raised_in_place():
    def source():
        yield 1
        yield 2
        raise ValueError("line 7 is bad")
    it = Prefetched(source())
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(ValueError, match="line 7 is bad"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_close_stops_an_endless_source():
    made = []

    def endless():
        i = 0
        while True:
            made.append(i)
            yield i
            i += 1
    it = Prefetched(endless(), depth=2)
    assert next(it) == 0
    time.sleep(0.2)
    assert len(made) <= 4          # at most depth ahead (plus the one being put)
    it.close()
    assert not any(t.name == "shardwise-prefetch" and t.is_alive() for t in threading.enumerate())


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth=0 must be an int >= 1"):
        Prefetched(iter([]), depth=0)


def test_synthetic_log_through_the_helper_is_the_same_data():
    cards = default_cardinalities(500)
    direct, ahead = SyntheticClicks(2, cards), SyntheticClicks(2, cards)
    starts = [i * 512 + 256 for i in range(20)]          # rank 1's slices of 20 steps, across blocks
    got = list(Prefetched(ahead.batch(s, 256) for s in starts))
    for s, b in zip(starts, got):
        want = direct.batch(s, 256)
        for f in ("dense", "ids", "labels"):
            np.testing.assert_array_equal(getattr(b, f), getattr(want, f))
