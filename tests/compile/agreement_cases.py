"""Per-rank workers for test_agreement.py: the ranks' agreement check rides in the step's own collectives."""
from __future__ import annotations

import torch

from shardwise.compile import DataParallel, collective_summary, compile
from shardwise.testing.harness import worker_mesh
from tests.compile.models import mlp_step as _step


def _gloo_calls(fn, steps: int) -> float:
    """gloo collectives per call of ``fn``, from the profiler's gloo events (what really ran)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    return sum(1 for e in prof.events() if e.name.startswith("gloo:")) / steps


def steady_state_collectives(rank, world, style, dtype=torch.float32, transform=False):
    """After the first step, a step runs exactly its graph's collectives (the check adds none) — unless no
    gradient bucket can count exactly (bfloat16): then the bits go alone, one more collective."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    # transform: a gm_transformation (here the identity) gets a graph torch.compile could take: functional
    # collectives, no kept buffers, the per-parameter update
    step = compile(parallel_mode=DataParallel(style, mesh=worker_mesh((world,))),
                   gm_transformation=(lambda gm: gm) if transform else None)(_step)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 6, generator=g).to(dtype), torch.randn(4, 4, generator=g).to(dtype)
    step(model, opt, x, y)
    per_step = _gloo_calls(lambda: step(model, opt, x, y), 3)
    in_graph = sum(c for c, _ in collective_summary(step.graph).values())
    carriers = [n.meta.get("sw_agree_carrier", False) for n in step.graph.graph.nodes
                if n.op == "call_function" and "c10d" in str(n.target) and "wait" not in str(n.target)]
    # then one rank changes its learning rate: every rank raises the same error, from the carried check
    opt.param_groups[0]["lr"] = 0.02 if rank == 0 else 0.01
    try:
        step(model, opt, x, y)
        err = None
    except ValueError as e:
        err = str(e)
    targets = {str(n.target) for n in step.graph.graph.nodes if n.op == "call_function"}
    kept = [n.target for n in step.graph.graph.nodes if n.op == "get_attr"]
    return {"per_step": per_step, "in_graph": in_graph, "carriers": carriers, "err": err,
            "in_place_collective": any("all_reduce_" in t for t in targets), "fused": any("_fused_" in t for t in targets),
            "kept_buffers": len(kept)}
