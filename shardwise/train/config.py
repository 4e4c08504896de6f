"""The settings of one training job, shared by the CLI, the launcher and every worker."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Optional

__all__ = ["TrainConfig", "JOB_SHARDING_TYPES"]

_DENSE_MODES = ("compile", "ddp")
# The job's planner picks among these by default. Row-wise splits of power-law tables put the hot
# rows on one rank, the imbalance a measured-load reshard exists to fix; column-wise would hide it
# (every rank serves every id), so it is left out unless asked for.
JOB_SHARDING_TYPES = ("table_wise", "row_wise", "data_parallel")
_ALL_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")


@dataclass
class TrainConfig:
    """Everything a worker needs; travels to workers as JSON so ``torchrun`` can pass it too.

    ``batch_size`` is per rank. ``reshard_at=0`` turns the live reshard off. ``rows`` is the size of
    the largest synthetic table (the others spread log-uniformly below it; None: the demo's 100000
    for the synthetic log, while raw-id logs need it or ``num_embeddings_per_feature``, and a
    categorified folder's manifest gives the sizes: see ``shardwise.train.sizes``).

    Example:
        >>> cfg = TrainConfig(steps=40, batch_size=128, out="report")
        >>> TrainConfig.from_json(cfg.to_json()) == cfg
        True
    """

    steps: int = 1000
    batch_size: int = 256
    out: str = "shardwise-report"
    reshard_at: Optional[int] = None     # None: halfway through the run
    # steps of measured load (on the current processes and layout) a reshard decision needs at least
    reshard_min_window: int = 10
    checkpoint_every: int = 200
    checkpoint_dir: Optional[str] = None  # None: <out>/checkpoints
    resume: bool = False
    data: Optional[str] = None
    seed: int = 0
    # DDP until compile-mode replicate is at least as fast in this job (docs/train.md, "Dense modes")
    dense_parallel: str = "ddp"
    # the tables' fused update through torch.compile: faster steps, but a compile at start-up that
    # the demo's 1000 steps do not win back (docs/train.md, "The compiled update")
    compile_update: bool = False
    rows: Optional[int] = None
    dim: int = 16
    lr_dense: float = 0.003
    lr_sparse: float = 0.05
    memory_per_rank_mb: Optional[float] = None   # None: measured on rank 0 (train/budget.py)
    num_embeddings_per_feature: Optional[list] = None   # 26 table sizes (TorchRec's DLRM flag); wins over rows
    max_rows: Optional[int] = None       # cap every table; ids fold modulo its size
    eval_data: Optional[str] = None      # held-out file scored at the end
    eval_fraction: Optional[float] = None   # or: the last fraction of --data, never trained on
    skip_bad_lines: bool = False         # skip and count malformed log lines instead of failing
    threads: Optional[int] = None        # None: this host's cores / the ranks on this host
    device: Optional[str] = None         # "cuda" | "cpu"; None: cuda when every local process has a GPU
    eval_rows: Optional[int] = None      # cap on the held-out rows scored; None: all (8192 of the synthetic log)
    log_every: int = 10
    quiet: bool = False
    # seconds a collective may wait for a missing rank before every waiting rank fails loudly
    collective_timeout: float = 600.0
    sharding_types: Optional[list] = None   # the planner's choices; None: JOB_SHARDING_TYPES
    # the synthetic log's drift (train/synthetic/drift.py): from this step on, drift_features get drift_factor
    # ids per example; None: no drift (the plain stream that benchmarks and golden values use)
    drift_at: Optional[int] = None
    drift_factor: int = 128
    drift_features: Optional[list] = None   # None: train/synthetic/drift.py's DRIFT_FEATURES
    # the planner's cost figures (Calibration.to_json()); None: measured at start-up on rank 0, so the
    # plan and the live reshard's decision follow the machine's load at that moment
    calibration: Optional[dict] = None

    def __post_init__(self):
        for name in ("steps", "batch_size", "rows", "dim", "eval_rows", "log_every"):
            v = getattr(self, name)
            if v is None and name in ("rows", "eval_rows"):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name}={v!r} must be a positive int")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every={self.checkpoint_every!r} must be an int >= 0 (0 = never)")
        if self.reshard_at is None:
            self.reshard_at = max(1, self.steps // 2)
        if not isinstance(self.reshard_at, int) or self.reshard_at < 0:
            raise ValueError(f"reshard_at={self.reshard_at!r} must be an int >= 0 (0 turns resharding off)")
        if not isinstance(self.reshard_min_window, int) or isinstance(self.reshard_min_window, bool) \
                or self.reshard_min_window < 1:
            raise ValueError(f"reshard_min_window={self.reshard_min_window!r} must be an int >= 1 (steps of measured "
                             f"load a reshard decision needs), e.g. --reshard-min-window 10")
        if not isinstance(self.compile_update, bool):
            raise ValueError(f"compile_update={self.compile_update!r} must be True or False (--compile-update)")
        if self.dense_parallel not in _DENSE_MODES:
            raise ValueError(f"dense_parallel={self.dense_parallel!r} must be one of {_DENSE_MODES}")
        if self.memory_per_rank_mb is not None and (not isinstance(self.memory_per_rank_mb, (int, float))
                                                    or not self.memory_per_rank_mb > 0):
            raise ValueError(f"memory_per_rank_mb={self.memory_per_rank_mb!r} must be a positive number of MiB "
                             f"(weights + optimizer state per rank), e.g. --memory-per-rank 6GiB")
        self._check_tables_and_eval()
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or self.threads < 1):
            raise ValueError(f"threads={self.threads!r} must be a positive int (CPU threads per process), e.g. "
                             f"--threads 4, or left out to share the host's cores among its ranks")
        if self.device not in (None, "cuda", "cpu"):
            raise ValueError(f"device={self.device!r} must be 'cuda', 'cpu' or None (automatic)")
        if not isinstance(self.collective_timeout, (int, float)) or self.collective_timeout <= 0:
            raise ValueError(f"collective_timeout={self.collective_timeout!r} must be a positive number of seconds")
        # numpy's SeedSequence takes no negative seed and torch.manual_seed none past 64 bits: a bad seed
        # would otherwise fail inside every worker, after the launch
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed!r} must be an int in [0, 2**63); pick e.g. --seed 0")
        if self.sharding_types is not None:
            bad = [t for t in self.sharding_types if t not in _ALL_TYPES]
            if bad or not self.sharding_types:
                raise ValueError(f"sharding_types={self.sharding_types!r}: {bad or 'empty'} not among {list(_ALL_TYPES)}; "
                                 f"e.g. --sharding-types table_wise to force an all-table-wise plan")
            self.sharding_types = list(self.sharding_types)
        self._check_drift()
        if self.calibration is not None:
            from ..embedding.plan.calibration import Calibration

            try:
                self.calibration = Calibration.from_json(self.calibration).to_json()
            except (TypeError, ValueError) as e:
                raise ValueError(f"calibration: {e}") from None
        if self.rows is not None and self.rows < 8:
            raise ValueError(f"rows={self.rows} must be >= 8 (the smallest synthetic table has 8 rows)")

    def _check_tables_and_eval(self) -> None:
        sizes = self.num_embeddings_per_feature
        if sizes is not None:
            if len(sizes) != 26 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes):
                raise ValueError(f"num_embeddings_per_feature={sizes!r} must be 26 positive ints, one per categorical "
                                 f"feature C1..C26, e.g. --num-embeddings-per-feature 1460,583,...")
            self.num_embeddings_per_feature = list(sizes)
        if self.max_rows is not None and (not isinstance(self.max_rows, int) or isinstance(self.max_rows, bool)
                                          or self.max_rows < 1):
            raise ValueError(f"max_rows={self.max_rows!r} must be a positive int (rows per table at most)")
        if self.eval_fraction is not None:
            if not isinstance(self.eval_fraction, (int, float)) or not 0 < self.eval_fraction < 1:
                raise ValueError(f"eval_fraction={self.eval_fraction!r} must be in (0, 1), e.g. --eval-fraction 0.1")
            if not self.data:
                raise ValueError("--eval-fraction holds out the end of --data: give --data (the synthetic log "
                                 "already scores held-out examples)")
            if self.eval_data:
                raise ValueError("give --eval-data or --eval-fraction, not both")

    def _check_drift(self) -> None:
        if self.drift_at is None:
            return
        if not isinstance(self.drift_at, int) or isinstance(self.drift_at, bool) or self.drift_at < 0:
            raise ValueError(f"drift_at={self.drift_at!r} must be a step >= 0 (--drift-at STEP)")
        if self.data:
            raise ValueError(f"--drift-at drifts the built-in synthetic log; --data {self.data!r} is a real log: "
                             f"leave one of them out")
        if not isinstance(self.drift_factor, int) or isinstance(self.drift_factor, bool) or self.drift_factor < 2:
            raise ValueError(f"drift_factor={self.drift_factor!r} must be an int >= 2 (ids per example after the "
                             f"drift), e.g. --drift-factor 16")
        if self.drift_features is not None:
            names = [f"C{i}" for i in range(1, 27)]
            bad = [f for f in self.drift_features if f not in names]
            if bad or not self.drift_features:
                raise ValueError(f"drift_features={self.drift_features!r}: {bad or 'empty'} not among C1..C26, "
                                 f"e.g. --drift-features C3,C7")
            self.drift_features = list(self.drift_features)

    @property
    def checkpoint_path(self) -> str:
        return self.checkpoint_dir or f"{self.out}/checkpoints"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "TrainConfig":
        raw = json.loads(text)
        if "eval_examples" in raw:   # the name of eval_rows in configs saved before it capped a whole-set eval
            raw["eval_rows"] = raw.pop("eval_examples")
        known = {f.name for f in dataclasses.fields(TrainConfig)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; known: {sorted(known)}")
        return TrainConfig(**raw)
