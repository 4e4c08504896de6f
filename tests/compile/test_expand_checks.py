"""DTensorExpandMode keeps the core's checks in its compiled graph and leaves the caller's settings alone:
an out-of-range id raises on every rank (also when only one rank's slice of the batch holds it), before
anything is updated, and a training step still matches one process afterwards."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardwise.testing.harness import run_on_ranks, worker_mesh

ROWS = 10


class _Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(ROWS, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, ids):
        return self.out(self.emb(ids).sum(1))


def _step(model, optimizer, ids, y):
    loss = F.mse_loss(model(ids), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def _max_diff(model, ref) -> float:
    return max((p.full_tensor() - q.detach()).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def compiled_id_check(rank, world):
    from shardwise.compile import DTensorExpandMode, compile
    from shardwise.tensor import EmbeddingIndexError, Replicate, Shard, gather_fallback
    from shardwise.tensor.dispatch import GATHER_FALLBACK

    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    model = _Lookup()
    ref = copy.deepcopy(model)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    row_wise = lambda fqn, p: [Shard(0)] if fqn == "emb.weight" else [Replicate()]  # noqa: E731
    # fallback on for the trace only: the caller's own setting (on here) must survive the trace
    mode = DTensorExpandMode(mesh, input_placements=([Shard(0)], [Shard(0)]), param_placements=row_wise,
                             fallback_to_replicate=True)
    step = compile(parallel_mode=mode)(_step)
    g = torch.Generator().manual_seed(1)
    batch = 2 * world
    ids, y = torch.randint(0, ROWS, (batch, 3), generator=g), torch.randn(batch, 3, generator=g)
    with gather_fallback(True):
        step(model, opt, ids, y)
        kept = GATHER_FALLBACK.get()
    _step(ref, ref_opt, ids, y)
    before = [p.full_tensor() for p in model.parameters()]
    bad = ids.clone()
    bad[-1, 0] = ROWS  # only the last rank's slice of the batch holds it
    try:
        step(model, opt, bad, y)
        error = None
    except EmbeddingIndexError as e:
        error = str(e)
    unchanged = all(torch.equal(p.full_tensor(), b) for p, b in zip(model.parameters(), before))
    step(model, opt, ids, y)
    _step(ref, ref_opt, ids, y)
    return {"error": error, "unchanged": unchanged, "diff": _max_diff(model, ref), "traces": step.traces,
            "kept": kept, "after": GATHER_FALLBACK.get()}


def test_out_of_range_id_in_a_compiled_step_raises_on_every_rank():
    for r in run_on_ranks(compiled_id_check, 2):
        assert r["error"] is not None and f"id {ROWS} is out of range" in r["error"], r
        assert "num_embeddings=10" in r["error"] and "nothing was looked up or modified" in r["error"]
        assert r["unchanged"]  # the check ran before the update: parameters untouched
        assert r["diff"] < 1e-6 and r["traces"] == 1  # the same graph still trains like one process
        assert r["kept"] is True and r["after"] is False
