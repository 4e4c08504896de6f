"""The synthetic log's inline generator: NumPy's PCG64 seeding and numbers, the probe of its ziggurat
tables, and NumPy's Generator as the fallback drawing the same examples."""

import numpy as np
import pytest
from numba.np.random import _constants

from shardwise.train.data import SyntheticClicks
from shardwise.train.synthetic import draw, pcg64
from tests.train.test_data import CARDS, _block_reference


def test_the_inline_generator_is_numpys_pcg64_and_its_fallback_draws_the_same(monkeypatch):
    rs = np.random.default_rng(7)
    for ints in [(0, 0), (1 << 64, 3), *(tuple(int(v) for v in rs.integers(0, 1 << 62, 3)) for _ in range(50))]:
        state = pcg64.seeded(draw.seed_words(*ints[:-1]), ints[-1])
        want = np.random.PCG64(np.random.SeedSequence(list(ints))).state["state"]
        assert (want["state"], want["inc"]) == (int(state[0]) << 64 | int(state[1]), int(state[2]) << 64 | int(state[3]))
    # the probe refuses tables that are not NumPy's, and the draw then takes NumPy's Generator
    assert draw._ziggurat_tables() is not None
    wrong = _constants.wi_double.copy()
    wrong[1:] *= 1.0 + 2 ** -50
    monkeypatch.setattr(_constants, "wi_double", wrong)
    assert draw._ziggurat_tables.__wrapped__() is None
    monkeypatch.setattr(draw, "_ziggurat_tables", lambda: None)
    fallback = SyntheticClicks(3, CARDS)
    for index in (0, 9):
        got, want = fallback._block(index), _block_reference(fallback, index)
        assert all(np.array_equal(g, w) for g, w in zip((got.dense, got.ids, got.labels), want))
    with pytest.raises(ValueError, match="non-negative"):
        SyntheticClicks(-1, CARDS)
