"""The validator's report: per-op counts, failures and a printable table (see ``checker.py``).

>>> r = ValidationReport({"aten.t.default": OpReport("aten.t.default", samples=1, checked=3)}, [], (2,))
>>> r.ok, r.summary()
(True, 'validated 1 ops on meshes [2]: 3 strategy checks, 0 failures, 0 need real ranks, 0 ops without samples (0.0 s)')
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Failure", "OpReport", "ValidationReport"]


@dataclass
class Failure:
    """One failed check. ``mesh_size``: an int (1-D mesh) or a mesh shape tuple; ``max_error`` is NaN
    when the check failed without a value to compare."""

    op: str
    sample: str
    mesh_size: int
    strategy: str
    max_error: float
    message: str

    def __str__(self) -> str:
        err = "" if self.max_error != self.max_error else f" max_err={self.max_error:.3g}"
        n = "x".join(map(str, self.mesh_size)) if isinstance(self.mesh_size, tuple) else self.mesh_size
        return f"{self.op} [{self.sample}] n={n} {self.strategy}:{err} {self.message}"


@dataclass
class OpReport:
    """Per-op counts. ``skipped``: strategies the dispatcher never picks for these inputs (a plain
    tensor asked to be non-replicated, an in-place op changing its argument's layout, a pending sum of
    bools); ``refused``: layouts a whole-mesh rule rejects with an error message."""

    op: str
    samples: int = 0
    checked: int = 0
    skipped: int = 0
    refused: int = 0
    real_ranks: list = field(default_factory=list)
    failures: list = field(default_factory=list)


@dataclass
class ValidationReport:
    """What ``validate_rules`` found; ``str(report)`` is a table, ``report.summary()`` one line."""

    ops: dict
    without_samples: list
    world_sizes: tuple
    seconds: float = 0.0

    @property
    def failures(self) -> list:
        return [f for r in self.ops.values() for f in r.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        checked = sum(r.checked for r in self.ops.values())
        real = sum(len(r.real_ranks) for r in self.ops.values())
        return (f"validated {len(self.ops)} ops on meshes {list(self.world_sizes)}: {checked} strategy checks, "
                f"{len(self.failures)} failures, {real} need real ranks, {len(self.without_samples)} ops "
                f"without samples ({self.seconds:.1f} s)")

    def __str__(self) -> str:
        width = max([len(k) for k in self.ops] + [2])
        lines = [f"{'op':<{width}}  samples  checked  skipped  refused  real  failed"]
        for name in sorted(self.ops):
            r = self.ops[name]
            lines.append(f"{name:<{width}}  {r.samples:7d}  {r.checked:7d}  {r.skipped:7d}  {r.refused:7d}  "
                         f"{len(r.real_ranks):4d}  {len(r.failures):6d}")
        if self.failures:
            lines += ["", "FAILURES:"] + [f"  {f}" for f in self.failures]
        real = [f"  {r.op} {x}" for r in self.ops.values() for x in r.real_ranks]
        if real:
            lines += ["", "needs real ranks (not simulated):"] + real
        if self.without_samples:
            lines += ["", "ops without samples:"] + [f"  {o}" for o in self.without_samples]
        return "\n".join(lines + ["", self.summary()])
