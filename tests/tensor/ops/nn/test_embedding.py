"""Sharded embedding lookups against unsharded F.embedding: layouts, gradients, empty shards."""

import pytest
import torch
import torch.nn.functional as F

from shardwise.tensor import MaskPartial, Partial, Replicate, Shard, distribute_tensor
from shardwise.tensor.spec import chunk_range
from shardwise.testing import run_on_ranks, worker_mesh


def _reference(table, ids, grad, padding_idx=None, scale=False):
    w = table.clone().requires_grad_()
    out = F.embedding(ids, w, padding_idx=padding_idx, scale_grad_by_freq=scale)
    out.backward(grad)
    return out.detach(), w.grad


def _lookup(table, ids, mesh, w_pl, ids_pl, grad, padding_idx=None, scale=False):
    """Sharded forward + backward; returns (output DTensor, full output, weight grad DTensor)."""
    w = distribute_tensor(table, mesh, w_pl).requires_grad_()
    ids_dt = distribute_tensor(ids, mesh, ids_pl)
    out = F.embedding(ids_dt, w, padding_idx=padding_idx, scale_grad_by_freq=scale)
    full = out.full_tensor()
    full.backward(grad)
    return out, full.detach(), w.grad


def _case_ids(v, shape, gen):
    ids = torch.randint(0, v, shape, generator=gen)
    ids.view(-1)[:2] = v - 1  # repeated ids, and the last row (owned by the last non-empty shard)
    return ids


def _rowwise_1d(rank, world):
    """Row-wise forward/backward over divisible, uneven and empty-shard table sizes."""
    mesh = worker_mesh((world,))
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for v in sorted({world * 3, world * 3 + 1, 5, 6, 1, world - 1} - {0}):
        for ids_shape in ((7,), (3, 5)):
            for pad in (None, v - 1, -1 if v > 1 else None, 0):
                table = torch.randn(v, 6, generator=gen)
                ids = _case_ids(v, ids_shape, gen)
                grad = torch.randn(*ids_shape, 6, generator=gen)
                scale = pad == 0  # frequency scaling too, on some cases
                ref_out, ref_grad = _reference(table, ids, grad, pad, scale)
                out, full, wgrad = _lookup(table, ids, mesh, [Shard(0)], [Replicate()], grad, pad, scale)
                assert out.placements == (MaskPartial(v, 0),), out.placements
                torch.testing.assert_close(full, ref_out)
                assert wgrad.placements == (Shard(0),), wgrad.placements
                rows = chunk_range(v, world, rank)[1]
                assert wgrad.to_local().shape == (rows, 6), (v, wgrad.to_local().shape)
                torch.testing.assert_close(wgrad.full_tensor(), ref_grad)
                checked += 1
    return checked


def _other_layouts_1d(rank, world):
    """Column-wise, ids-sharded and replicated tables; scale_grad_by_freq; max_norm row-wise."""
    mesh = worker_mesh((world,))
    gen = torch.Generator().manual_seed(1)
    cases = [
        ([Shard(1)], [Replicate()], (Shard(1),), (Shard(2),)),
        ([Replicate()], [Shard(0)], (Partial(),), (Shard(0),)),
        ([Replicate()], [Shard(1)], (Partial(),), (Shard(1),)),
        ([Replicate()], [Replicate()], None, (Replicate(),)),
    ]
    for w_pl, ids_pl, grad_pl, out_pl in cases:
        for v, dim in ((world * 2, 5), (world * 2 + 1, world + 1)):
            for scale in (False, True):
                table = torch.randn(v, dim, generator=gen)
                ids = _case_ids(v, (2 * world + 1, 3), gen)
                grad = torch.randn(2 * world + 1, 3, dim, generator=gen)
                ref_out, ref_grad = _reference(table, ids, grad, 1, scale)
                out, full, wgrad = _lookup(table, ids, mesh, w_pl, ids_pl, grad, 1, scale)
                assert out.placements == out_pl, (w_pl, ids_pl, out.placements)
                torch.testing.assert_close(full, ref_out)
                if grad_pl is not None and not (scale and grad_pl == (Partial(),)):
                    assert wgrad.placements == grad_pl, (w_pl, ids_pl, scale, wgrad.placements)
                torch.testing.assert_close(wgrad.full_tensor(), ref_grad)
    # max_norm renormalises the looked-up rows of a row-wise table in place, like unsharded
    table = torch.randn(world * 2 + 1, 4, generator=gen) * 3
    ids = _case_ids(world * 2 + 1, (9,), gen)
    ref = table.clone()
    ref_out = F.embedding(ids, ref, max_norm=1.0)
    w = distribute_tensor(table, mesh, [Shard(0)])
    out = F.embedding(distribute_tensor(ids, mesh, [Replicate()]), w, max_norm=1.0)
    torch.testing.assert_close(out.full_tensor(), ref_out)
    torch.testing.assert_close(w.full_tensor(), ref)
    return True


def _two_d_mesh(rank, world):
    """2-D mesh combinations: nested row shards, rows x columns, rows x batch-sharded ids."""
    mesh = worker_mesh((2, 2))
    gen = torch.Generator().manual_seed(2)
    cases = [
        ([Shard(0), Shard(0)], [Replicate(), Replicate()], (Shard(0), Shard(0))),
        ([Shard(0), Shard(1)], [Replicate(), Replicate()], (Shard(0), Shard(1))),
        ([Shard(1), Shard(0)], [Replicate(), Replicate()], (Shard(1), Shard(0))),
        ([Shard(0), Replicate()], [Replicate(), Shard(0)], (Shard(0), Partial())),
    ]
    for w_pl, ids_pl, grad_pl in cases:
        for v in (8, 7, 3):
            table = torch.randn(v, 6, generator=gen)
            ids = _case_ids(v, (5, 2), gen)
            grad = torch.randn(5, 2, 6, generator=gen)
            ref_out, ref_grad = _reference(table, ids, grad, v - 1)
            out, full, wgrad = _lookup(table, ids, mesh, w_pl, ids_pl, grad, v - 1)
            for m, p in enumerate(w_pl):
                if p == Shard(0):
                    assert out.placements[m] == MaskPartial(v, m), (w_pl, out.placements)
            torch.testing.assert_close(full, ref_out)
            assert wgrad.placements == grad_pl, (w_pl, ids_pl, wgrad.placements)
            torch.testing.assert_close(wgrad.full_tensor(), ref_grad)
    return True


@pytest.mark.parametrize("world", [2, 4])
def test_rowwise_matches_unsharded(world):
    counts = run_on_ranks(_rowwise_1d, world)
    assert counts[0] >= 32 and len(set(counts)) == 1


def test_other_layouts_match_unsharded():
    assert run_on_ranks(_other_layouts_1d, 2) == [True, True]


def test_two_d_mesh_layouts():
    assert run_on_ranks(_two_d_mesh, 4) == [True] * 4
