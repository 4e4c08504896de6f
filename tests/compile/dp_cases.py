"""Per-rank worker functions for the compile tests (run through run_on_ranks)."""
from __future__ import annotations

import copy

import torch

from shardwise.compile import DataParallel, collective_summary, compile, format_graph
from shardwise.testing.harness import worker_mesh
from tests.compile.models import make_case, make_optimizer


def _max_diff(model, ref) -> float:
    return max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def train_vs_single(rank, world, style, opt_name, model_name, steps=5, print_graph=False, **mode_kw):
    """Train compiled DP and single-process on the global batch; return diffs after each step."""
    mesh = worker_mesh((world,))
    model, fn, batches = make_case(model_name, 4 * world)
    ref = copy.deepcopy(model)
    ref_opt = make_optimizer(opt_name, ref.parameters())
    opt = make_optimizer(opt_name, model.parameters())
    step = compile(parallel_mode=DataParallel(mesh, style=style, **mode_kw))(fn)
    out = []
    for x, y in batches[:steps]:
        loss = step(model, opt, x, y)
        ref_loss = fn(ref, ref_opt, x, y)
        out.append((abs(float(loss - ref_loss)), _max_diff(model, ref)))
    if print_graph and rank == 0:
        print(format_graph(step.graph))
    return {"diffs": out, "traces": step.traces, "collectives": collective_summary(step.graph)}
