"""Comparison helpers whose failures say what differs, where, and on which rank.

Two kinds of equality matter in distributed tests: *exact* agreement (plans, orders, integer
results, anything every rank must hold identically) and *close* agreement with single-process
ground truth (floating-point results whose summation order differs from plain PyTorch).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.distributed as dist

from . import simulate

__all__ = [
    "assert_same",
    "assert_close",
    "assert_ranks_agree",
    "assert_same_on_all_ranks",
    "assert_shards_match",
]


def assert_same(actual: Any, expected: Any, what: str = "value") -> None:
    """Exact equality of nested tensors, numbers, strings, lists, tuples and dicts.

    Tensors must match in shape, dtype and every element (NaN equals NaN); dicts must also list
    their keys in the same order, since iteration order shapes collectives.

    Example::

        assert_same({"a": torch.ones(2)}, {"a": torch.ones(2)}, what="plan")
    """
    diff = _first_difference(actual, expected, what)
    if diff is not None:
        raise AssertionError(diff)


def assert_close(actual: Any, expected: Any, *, what: str = "value",
                 rtol: float | None = None, atol: float | None = None) -> None:
    """``torch.testing.assert_close`` (dtype-aware tolerances, nested containers) naming ``what``.

    Example::

        assert_close(out, reference_model(x), what="forward output")
    """
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def assert_ranks_agree(results: Sequence[Any], what: str = "result") -> None:
    """Every rank's value is exactly rank 0's (e.g. on the list :meth:`ProcessPool.run` returns).

    Example::

        assert_ranks_agree(pool.run(build_plan), what="reshard plan")
    """
    if len(results) == 0:
        raise ValueError("results is empty: pass one value per rank")
    for rank in range(1, len(results)):
        diff = _first_difference(results[rank], results[0], f"{what} on rank {rank} vs rank 0")
        if diff is not None:
            raise AssertionError(diff)


def assert_same_on_all_ranks(value: Any, group: Any, what: str = "value") -> None:
    """Called on every rank inside a harness call: checks all ranks hold exactly this value.

    Every rank compares the same gathered list, so all ranks raise or none does. Use it on
    anything that shapes a collective (plans, bucket orders, tags).

    Example::

        def fn(ctx):
            assert_same_on_all_ranks(make_plan(...), ctx.group, what="plan")
    """
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, _detached_cpu(value), group=group)
    assert_ranks_agree(gathered, what)


def assert_shards_match(shards: Sequence[torch.Tensor], full: torch.Tensor, dim: int,
                        what: str = "shards", rtol: float | None = None,
                        atol: float | None = None) -> None:
    """``shards[r]`` is rank ``r``'s ``torch.chunk`` shard of ``full`` along ``dim``.

    Example::

        assert_shards_match(pool.run(local_part), reference, dim=0, what="Shard(0) output")
    """
    expected = simulate.shard(full, dim, len(shards))
    for rank, (got, want) in enumerate(zip(shards, expected)):
        assert_close(got, want, what=f"{what} on rank {rank}", rtol=rtol, atol=atol)


def _first_difference(a: Any, b: Any, path: str) -> str | None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return _tensor_difference(a, b, path)
    if type(a) is not type(b):
        return f"{path}: type {type(a).__name__} != {type(b).__name__} ({a!r} vs {b!r})"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} != {list(b)} (order matters)"
        return _first_of((a[k], b[k], f"{path}[{k!r}]") for k in a)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        return _first_of((x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        equal = bool(a == b)
    except Exception as exc:  # noqa: BLE001 - objects whose == is not a plain bool
        return f"{path}: cannot compare {a!r} and {b!r} ({type(exc).__name__}: {exc})"
    return None if equal else f"{path}: {a!r} != {b!r}"


def _first_of(triples) -> str | None:
    for x, y, path in triples:
        diff = _first_difference(x, y, path)
        if diff is not None:
            return diff
    return None


def _tensor_difference(a: Any, b: Any, path: str) -> str | None:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{path}: shape/dtype {tuple(a.shape)}/{a.dtype} != {tuple(b.shape)}/{b.dtype}"
    a, b = a.detach().cpu(), b.detach().cpu()
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= a.isnan() & b.isnan()
    if bool(same.all()):
        return None
    first = tuple(int(i) for i in (~same).nonzero()[0])
    return (f"{path}: {int((~same).sum())} of {a.numel()} elements differ; first at index "
            f"{first}: {a[first].item()!r} != {b[first].item()!r}")


def _detached_cpu(value: Any) -> Any:
    """Tensors compared across ranks travel detached and on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _detached_cpu(v)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_detached_cpu(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_detached_cpu(v) for v in value)
    return value
