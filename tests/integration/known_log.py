"""A Criteo-format log whose labels depend on known features, for end-to-end accuracy checks.

C1, C2 and C3 carry the signal: each id has a fixed effect on the label's logit (ids the training file
never holds have effect 0, and the held-out file draws some of them); I1 adds a dense effect. The other
23 features are noise. ``logits`` returns the label's own logit per line: its AUC is the best any model
can reach on those rows.
"""

from __future__ import annotations

import numpy as np

SIGNAL = (0, 1, 2)     # C1, C2, C3
VOCAB = 40             # ids per signal feature seen in training
UNSEEN = 1000          # ids >= UNSEEN appear only in the held-out file (effect 0)


def _effects(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1.2, (len(SIGNAL), VOCAB))


def write_known_log(path, n: int, seed: int, unseen_rate: float = 0.0, effects_seed: int = 7) -> tuple:
    """Write ``n`` lines to ``path``; return (each line's logit, label, raw ids as written [n, 26], -1 =
    missing). ``unseen_rate``: share of signal ids replaced by ids never seen in training (effect 0)."""
    rng = np.random.default_rng(seed)
    eff = _effects(effects_seed)
    ids = np.minimum(np.floor(np.exp(rng.random((n, 26)) * np.log(VOCAB + 1))) - 1, VOCAB - 1).astype(np.int64)
    noise = rng.integers(0, 2, (n, 26))
    ids[:, 3:] = noise[:, 3:]
    logit = np.full(n, -0.8)
    unseen = rng.random((n, len(SIGNAL))) < unseen_rate
    for k, j in enumerate(SIGNAL):
        logit += np.where(unseen[:, k], 0.0, eff[k][ids[:, j]])
        ids[unseen[:, k], j] = UNSEEN + rng.integers(0, 50, int(unseen[:, k].sum()))
    dense = np.ones((n, 13), np.int64)
    dense[:, 0] = rng.integers(0, 100, n)
    logit += 0.5 * (np.log1p(dense[:, 0]) - 2.5)
    labels = rng.random(n) < 1 / (1 + np.exp(-logit))
    ids[rng.random((n, 26)) < 0.02] = -1                     # some missing ids (an empty bag)
    raw = np.where(ids < 0, -1, ids * 2654435761 % 2**32)
    with open(path, "w") as f:
        for y, d, c in zip(labels, dense, raw):
            cats = ["" if v < 0 else format(int(v), "08x") for v in c]
            f.write("\t".join([str(int(y)), *map(str, d), *cats]) + "\n")
    return logit, labels.astype(np.float32), raw
