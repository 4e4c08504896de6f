"""The planner's cost figures, measured on this machine: per-type costs a step is estimated from.

Seven figures price a step: the lookup (forward, backward and the fused update) per call, per id
and per byte of looked-up row; all-to-all and all-reduce per byte and per message. ``calibrate()``
measures them with a short micro-benchmark that every rank runs (collectives need every rank) and
then broadcasts rank 0's figures, so every rank plans from the same numbers: each rank's own timings
differ by noise, and a plan that differed between ranks would hang the first collective. Planning
itself runs no collectives: a recorded calibration (``metrics.json``'s ``"calibration"``) or
``Calibration.nominal()`` lets one process plan any world size, deterministically.

Example:
    >>> cal = Calibration.nominal()
    >>> Calibration.from_json(cal.to_json()) == cal
    True
    >>> cal = calibrate(torch.device("cpu"))   # a collective: every rank calls it
    >>> cal.source
    'measured on rank 0 (micro-benchmark), broadcast to every rank'
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["Calibration", "calibrate", "measure_local"]

_TIMED = ("lookup_s_per_call", "lookup_s_per_id", "lookup_s_per_byte", "all_to_all_s_per_byte",
          "all_to_all_s_per_message", "all_reduce_s_per_byte", "all_reduce_s_per_message")


@dataclass(frozen=True)
class Calibration:
    """Seconds per unit of each cost the planner models (see the module docstring).

    ``*_per_byte`` of a collective: per byte one rank sends to other ranks (all-reduce: per byte of
    its ring traffic, 2(W-1)/W of the buffer). ``*_per_message``: per peer message (an all-to-all
    sends W-1, a ring all-reduce 2(W-1)). ``cross_host_factor``: how much more a byte costs between
    hosts than inside one; one machine cannot measure it, so it stays an assumption: 48, the ratio of
    TorchRec's planner defaults (600 GB/s inside a node, 12.5 GB/s between nodes).

    Example: see the module's.
    """

    lookup_s_per_call: float
    lookup_s_per_id: float
    lookup_s_per_byte: float
    all_to_all_s_per_byte: float
    all_to_all_s_per_message: float
    all_reduce_s_per_byte: float
    all_reduce_s_per_message: float
    cross_host_factor: float = 48.0
    source: str = "nominal figures, not measured"
    world_size: int = 0
    device: str = ""

    def __post_init__(self):
        for name in _TIMED + ("cross_host_factor",):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 or v == float("inf"):
                raise ValueError(f"Calibration.{name}={v!r} must be a finite number >= 0 (seconds per unit); "
                                 f"measure one with calibrate() or start from Calibration.nominal()")

    @staticmethod
    def nominal() -> "Calibration":
        """Round figures of no particular machine, for simulating plans where nothing was measured:
        a GPU node as TorchRec's planner assumes one (600 GB/s between its GPUs, 900 GB/s of memory
        bandwidth), 1 ns per id, 20 us per lookup call, 10 us per message. ``shardwise train``
        measures its own with :func:`calibrate`."""
        return Calibration(lookup_s_per_call=20e-6, lookup_s_per_id=1e-9, lookup_s_per_byte=1 / 900e9,
                           all_to_all_s_per_byte=1 / 600e9, all_to_all_s_per_message=10e-6,
                           all_reduce_s_per_byte=1 / 600e9, all_reduce_s_per_message=10e-6)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(raw) -> "Calibration":
        """From :meth:`to_json`'s dict, its JSON text, or a ``metrics.json`` holding one under ``"calibration"``."""
        if isinstance(raw, str):
            raw = json.loads(raw)
        if isinstance(raw, dict) and isinstance(raw.get("calibration"), dict):
            raw = raw["calibration"]
        fields = {f.name for f in dataclasses.fields(Calibration)}
        if not isinstance(raw, dict) or set(_TIMED) - set(raw) or set(raw) - fields:
            got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
            raise ValueError(f"a calibration needs the fields {list(_TIMED)} (optional: cross_host_factor, source, "
                             f"world_size, device), got {got}; pass a shardwise train metrics.json or "
                             f"Calibration.to_json() output")
        return Calibration(**raw)


def _best_time(fn: Callable[[], None], sync: Callable[[], None], repeats: int = 4, inner: int = 2) -> float:
    """The fastest of ``repeats`` timings of ``inner`` calls, per call: the least disturbed by other load."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _lookup_time(n: int, dim: int, device, sync) -> float:
    """One fused lookup of ``n`` ids (bags of one id) in a [4096, dim] buffer: forward, the per-row
    gradient sum and a gather-update-scatter of the touched rows, as the sharded module runs them."""
    from ..sharding.store import summed_row_gradients

    g = torch.Generator().manual_seed(0)
    weight = torch.rand(4096, dim, generator=g).to(device)
    ids = torch.randint(0, 4096, (n,), generator=g).to(device)
    offsets = torch.arange(n + 1, device=device)

    def step():
        out = F.embedding_bag(ids, weight, offsets, mode="sum", include_last_offset=True)
        rows, grad = summed_row_gradients(ids, offsets, None, torch.ones_like(out), weight.shape[0])
        weight.index_copy_(0, rows, weight.index_select(0, rows).sub_(grad, alpha=1e-3))
    return _best_time(step, sync)


def _collective_times(device, group, sync) -> tuple:
    """(all-to-all small, large, all-reduce small, large) seconds and the large sizes' per-peer elements."""
    world = dist.get_world_size(group)
    small, large = 1, 1 << 14          # float32 elements per peer (all-to-all) or in the buffer (all-reduce)
    out = []
    for n in (small, large):
        send, recv = torch.ones(n * world, device=device), torch.empty(n * world, device=device)
        out.append(_best_time(lambda: dist.all_to_all_single(recv, send, group=group), sync))
    for n in (small, large):
        buf = torch.ones(n, device=device)
        out.append(_best_time(lambda: dist.all_reduce(buf, group=group), sync))
    return tuple(out), large


def measure_local(device: torch.device, group=None) -> dict:
    """This rank's timings (collective: every rank of ``group`` must call it). Clamped at zero: a
    difference of two noisy timings can come out slightly negative."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    n0, n1, d1, d2 = 16, 4096, 16, 128
    t_tiny, t_big, t_wide = (_lookup_time(n0, d1, device, sync), _lookup_time(n1, d1, device, sync),
                             _lookup_time(n1, d2, device, sync))
    per_byte = max(0.0, (t_wide - t_big) / (n1 * (d2 - d1) * 4))
    per_id = max(0.0, (t_big - t_tiny) / (n1 - n0) - per_byte * d1 * 4)
    per_call = t_tiny        # measured directly: an intercept fitted from noisy timings can come out <= 0
    cal = {"lookup_s_per_call": per_call, "lookup_s_per_id": per_id, "lookup_s_per_byte": per_byte}
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world == 1:   # no peer to time against: nominal figures (they price nothing at world 1 anyway)
        nom = Calibration.nominal()
        return {**cal, **{k: getattr(nom, k) for k in _TIMED[3:]}}
    (a2a_s, a2a_l, ar_s, ar_l), large = _collective_times(device, group, sync)
    peers = world - 1
    ring = 2 * (world - 1) / world         # bytes a ring all-reduce moves per byte of buffer
    cal["all_to_all_s_per_byte"] = max(0.0, (a2a_l - a2a_s) / (peers * (large - 1) * 4))
    cal["all_to_all_s_per_message"] = a2a_s / peers
    cal["all_reduce_s_per_byte"] = max(0.0, (ar_l - ar_s) / (ring * (large - 1) * 4))
    cal["all_reduce_s_per_message"] = ar_s / (2 * peers)
    return cal


def calibrate(device: torch.device, group=None, measure: Optional[Callable[[], dict]] = None,
              given: Optional[Calibration] = None) -> Calibration:
    """Measure on every rank, keep rank 0's figures (broadcast), so every rank plans alike.

    Collective: every rank of ``group`` (default: the world) calls it. ``measure`` replaces the local
    micro-benchmark (returns :data:`_TIMED`'s figures); tests use it to give ranks different timings.
    ``given`` (a recorded calibration, e.g. ``shardwise train --calibration``) is used instead of
    measuring, rank 0's copy broadcast, so plans are reproducible and the same on every rank even
    where hosts read different files.

    Example:
        >>> from shardwise.embedding import GreedyShardingPlanner
        >>> cal = calibrate(torch.device("cpu"))
        >>> planner = GreedyShardingPlanner(dist.get_world_size(), 2**30, calibration=cal)
    """
    world = dist.get_world_size(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    if given is not None:   # every field of rank 0's copy, its source included
        box = [given]
        dist.broadcast_object_list(box, src, group=group, device=device)
        return dataclasses.replace(box[0], source=f"given ({box[0].source}), rank 0's copy broadcast to every rank",
                                   world_size=world, device=device.type)
    mine = (measure or (lambda: measure_local(device, group)))()
    vals = torch.tensor([float(mine[k]) for k in _TIMED], dtype=torch.float64, device=device)
    dist.broadcast(vals, src, group=group)
    return Calibration(**dict(zip(_TIMED, vals.tolist())), source="measured on rank 0 (micro-benchmark), "
                       "broadcast to every rank", world_size=world, device=device.type)
