"""The synthetic click log's machinery: its draw as numba loops (``draw``: sub-blocks, bags), NumPy's
SeedSequence / PCG64 / ziggurat normal in numba (``pcg64``: the same numbers as NumPy's generator) and
the drifting log (``drift``: some features' hidden effects change from one example on).
``SyntheticClicks`` itself is ``shardwise.train.data``'s.

Example:
    >>> from shardwise.train.synthetic import DriftingClicks, DRIFT_FEATURES
    >>> len(DRIFT_FEATURES) > 0
    True
"""


def __getattr__(name):
    # drift imports train/data, which imports this package's draw: load it on demand, not here
    if name in ("DriftingClicks", "DRIFT_FEATURES"):
        from . import drift
        return getattr(drift, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DriftingClicks", "DRIFT_FEATURES"]
