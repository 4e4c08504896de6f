"""torch.compile(fullgraph=True) of sharded embedding lookups (as PyTorch's test_embedding_ops does),
against F.embedding on the full table: values, gradients (a pending-sum output's gradient comes back
replicated), and the id range check kept in the compiled graph (an out-of-range id raises on every
rank, also where only some ranks hold it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardwise.testing.harness import run_on_ranks, worker_mesh


def _error(fn) -> str:
    try:
        fn()
        return "no error"
    except Exception as e:  # noqa: BLE001 - the test compares the exception's type and text
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def _compiled_case(mesh, w_placements, ids_placements, seed):
    from shardwise.tensor import distribute_tensor

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(13, 6, generator=gen)
    emb = torch.nn.Embedding(13, 6)
    emb.weight = torch.nn.Parameter(distribute_tensor(table, mesh, w_placements))
    compiled = torch.compile(emb, fullgraph=True)
    ok = []
    for _ in range(2):  # a second batch reuses the graph
        ids = torch.randint(0, 13, (4, 6), generator=gen)
        grad = torch.randn(4, 6, 6, generator=gen)
        out = compiled(distribute_tensor(ids, mesh, ids_placements))
        full = out.full_tensor()
        full.backward(grad)
        ref_w = table.clone().requires_grad_()
        F.embedding(ids, ref_w).backward(grad)
        ok.append(torch.equal(full, F.embedding(ids, table)))
        ok.append(torch.allclose(emb.weight.grad.full_tensor(), ref_w.grad))
        emb.weight.grad = None
    bad = torch.randint(0, 13, (4, 6), generator=gen)
    bad[1, 2] = 13  # in the first row block: with sharded ids, only some ranks hold it
    err = _error(lambda: compiled(distribute_tensor(bad, mesh, ids_placements)).full_tensor())
    return ok, err


def compile_calls(rank, world):
    from shardwise.tensor import Replicate, Shard

    row_wise = _compiled_case(worker_mesh((world,)), [Shard(0)], [Replicate()], 0)
    # a 2-D mesh: ids sharded over the second dim, so the range check reduces its verdict across ranks
    mesh2 = worker_mesh((2, world // 2))
    row_sharded_ids = _compiled_case(mesh2, [Shard(0), Replicate()], [Replicate(), Shard(0)], 1)
    return row_wise, row_sharded_ids


def test_compiled_row_wise_lookup_matches_eager_and_keeps_the_id_check():
    for case in zip(*run_on_ranks(compile_calls, 4)):
        errors = {err for _, err in case}
        assert len(errors) == 1, f"every rank raises the same error: {errors}"
        err = errors.pop()
        assert err.startswith("EmbeddingIndexError: embedding: id 13 is out of range"), err
        for ok, _ in case:
            assert ok == [True, True] * 2, ok
