r"""Taking a trained model out of the job: export it unsharded, load it anywhere, score raw logs.

- ``export_model(run_or_checkpoint, out)`` (``shardwise export``): the sharded checkpoint read with
  ``torch.distributed.checkpoint`` on one process, written as a plain state dict, a small module
  definition (``model.py``, plain PyTorch), ``model.json`` and the training vocabulary;
- ``load_model(folder)``: the exported model (``ClickModel``), on the CPU, without a process group;
  ``model.score(counts, raw_ids)`` gives click probabilities;
- ``predict_file(folder, logs, out)`` (``shardwise predict``): raw Criteo-format lines -> one score per
  line, and the AUC when they are labelled.

The format is in ``shardwise/serve/standalone.py`` (copied into every export as ``model.py``) and
docs/data.md ("Serving").

Example:
    >>> import numpy as np
    >>> spec = {"sparse_features": [f"C{i + 1}" for i in range(26)], "table_sizes": [5] * 26, "dim": 4,
    ...         "bottom": [13, 8, 4], "top": [4 + 27 * 26 // 2, 8, 1]}
    >>> ClickModel(spec).eval().score(np.ones((2, 13)), np.full((2, 26), 7)).shape   # ids fold: 7 % 5
    (2,)
"""

from __future__ import annotations

from .export import export_model, find_checkpoint
from .predict import PredictResult, predict_file, score_lines
from .standalone import ClickModel
from .standalone import load as load_model

__all__ = ["export_model", "find_checkpoint", "load_model", "ClickModel", "predict_file", "score_lines",
           "PredictResult"]
