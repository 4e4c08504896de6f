"""Per-rank worker functions for the compile tests of training, bucketing, expansion and graph kinds (run
through run_on_ranks; guards and errors: guard_cases.py)."""
from __future__ import annotations

import copy
import math

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from shardwise.compile import DataParallel, collective_summary, compile
from shardwise.compile.graph_utils import is_collective, is_wait
from shardwise.testing.harness import worker_device, worker_mesh
from tests.compile.models import make_case, make_optimizer


def _max_diff(params, ref_params) -> float:
    return max((p.full_tensor() - q.detach()).abs().max().item() for p, q in zip(params, ref_params))


def _local_numels(step, opt) -> dict:
    st = step.state
    return {
        "params": sum(st.storage[n].numel() for n in st.names),
        "expected": sum(
            math.ceil(lay.shape[0] / lay.world) * math.prod(lay.shape[1:]) if lay.sharded else math.prod(lay.shape)
            for lay in st.layouts.values()
        ),
        "total": sum(math.prod(lay.shape) for lay in st.layouts.values()),
        "rows": {n: (tuple(st.storage[n].shape), st.layouts[n].sharded) for n in st.names},
        "state": {n: {k: tuple(v.shape) for k, v in st.states[n].items()} for n in st.names},
        "placements": sorted({str(p.placements) for p in st.params.values()}),
        "opt_state_types": sorted({type(v).__name__ for s in opt.state.values() for v in s.values()}),
    }


def train_matrix(rank, world, combos, steps=5, input="local", **mode_kw):
    """For each (model, style, optimizer): compiled DP vs single process on the global batch vs eager DDP.

    ``input="local"``: each rank passes only its slice of the global batch and the mode's mesh is the
    default (all ranks of the default group), as a DDP user would write it."""
    mesh = worker_mesh((world,))
    device = worker_device()  # cuda:LOCAL_RANK under `make test-gpu`
    results = []
    for model_name, style, opt_name in combos:
        model, fn, batches = make_case(model_name, 4 * world)
        model, batches = model.to(device), [(x.to(device), y.to(device)) for x, y in batches]
        ref, ddp = copy.deepcopy(model), DDP(copy.deepcopy(model), process_group=mesh.get_group())
        ref_opt, ddp_opt = make_optimizer(opt_name, ref.parameters()), make_optimizer(opt_name, ddp.parameters())
        opt = make_optimizer(opt_name, model.parameters())
        mode = DataParallel(style, **mode_kw) if input == "local" else DataParallel(style, mesh=mesh, input=input,
                                                                                    **mode_kw)
        step = compile(parallel_mode=mode)(fn)
        rec = {"combo": (model_name, style, opt_name), "single": [], "ddp": [], "loss": []}
        for i, (x, y) in enumerate(batches[:steps]):
            xl, yl = x.chunk(world)[rank], y.chunk(world)[rank]
            loss = step(model, opt, xl, yl) if input == "local" else step(model, opt, x, y)
            ref_loss = fn(ref, ref_opt, x, y)
            fn(ddp, ddp_opt, xl, yl)
            # the step returns this rank's loss; their mean is the global-batch loss
            mean_loss = loss.detach().clone()
            torch.distributed.all_reduce(mean_loss, group=mesh.get_group())
            rec["loss"].append(abs(mean_loss.item() / world - ref_loss.item()))
            if i in (0, steps - 1):  # parameters after the first and the last step
                rec["single"].append(_max_diff(list(model.parameters()), list(ref.parameters())))
                rec["ddp"].append(_max_diff(list(model.parameters()), list(ddp.module.parameters())))
        rec["traces"] = step.traces
        rec["collectives"] = collective_summary(step.graph)
        rec["numels"] = _local_numels(step, opt)
        rec["graph"] = graph_checks(step.graph)
        rec["mesh_is_world"] = step.mode.mesh.size() == world and step.mode.mesh.device_type == device.type
        results.append(rec)
    return results


def graph_checks(gm) -> dict:
    """Structural facts about a per-rank graph, checked by the tests."""
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    waits_ok = all(n.next in n.users for n in nodes if is_wait(n))
    bwd_start = next((pos[n] for n in nodes if n.meta.get("sw_region") == "backward"), len(nodes))
    # every value computed from a forward all-gather must be dead before the backward starts
    fwd = {n for n in nodes if is_collective(n) and n.meta.get("sw_role") == "gather_fwd"}
    frontier, live_end = list(fwd), -1
    seen = set(fwd)
    while frontier:
        n = frontier.pop()
        for u in n.users:
            live_end = max(live_end, pos[u])
            if u not in seen and u.meta.get("sw_region") != "backward" and u.op != "output" and (
                    u.meta.get("sw_role") == "gather_fwd" or all(i in seen for i in u.all_input_nodes)):
                seen.add(u)
                frontier.append(u)
    return {"waits_before_first_use": waits_ok, "fwd_gather_dead_before_bwd": live_end < bwd_start,
            "bwd_gathers": sum(1 for n in nodes if is_collective(n) and n.meta.get("sw_role") == "gather_bwd")}


def bucketing_pair(rank, world, model_name, style, opt_name):
    """Same training with per-parameter collectives and with buckets."""
    mesh = worker_mesh((world,))
    out = {}
    finals = []
    for cap in (0, 1 << 20):
        model, fn, batches = make_case(model_name, 4 * world)
        opt = make_optimizer(opt_name, model.parameters())
        step = compile(parallel_mode=DataParallel(style, mesh=mesh, input="global", bucket_cap_bytes=cap,
                                                  gather_bucket_cap_bytes=cap))(fn)
        for x, y in batches[:3]:
            step(model, opt, x, y)
        out[cap] = collective_summary(step.graph)
        out[f"code_{cap}"] = step.graph.code
        finals.append([p.full_tensor() for p in model.parameters()])
    out["max_diff"] = max((a - b).abs().max().item() for a, b in zip(*finals))
    return out












def expand_vs_single(rank, world, model_name, opt_name, shard_params=False, steps=3, fallback=False, cap=4 << 20):
    """DTensorExpandMode (batch Shard(0), params Replicate or Shard(0)) vs one process."""
    from shardwise.compile import DTensorExpandMode
    from shardwise.tensor import Replicate, Shard

    mesh = worker_mesh((world,))
    model, fn, batches = make_case(model_name, 4 * world)
    ref = copy.deepcopy(model)
    opt, ref_opt = make_optimizer(opt_name, model.parameters()), make_optimizer(opt_name, ref.parameters())
    rule = (lambda fqn, p: [Shard(0)] if p.dim() == 2 and p.shape[0] % world == 0 else [Replicate()]) \
        if shard_params else None
    mode = DTensorExpandMode(mesh, input_placements=([Shard(0)], [Shard(0)]), param_placements=rule,
                             fallback_to_replicate=fallback, bucket_cap_bytes=cap)
    step = compile(parallel_mode=mode)(fn)
    diffs = []
    for x, y in batches[:steps]:
        loss = step(model, opt, x, y)
        ref_loss = fn(ref, ref_opt, x, y)
        diffs.append((abs(loss.item() - ref_loss.item()), _max_diff(list(model.parameters()), list(ref.parameters()))))
    from shardwise.compile.classify import kind_counts

    return {"diffs": diffs, "collectives": collective_summary(step.graph), "traces": step.traces,
            "placements": sorted({str(p.placements) for p in model.parameters()}),
            "kinds": dict(kind_counts(step.graph))}












def graph_kinds(rank, world, style):
    """Provenance tags of the final per-rank graph."""
    from collections import Counter

    mesh = worker_mesh((world,))
    model, fn, batches = make_case("mlp", 4 * world)
    opt = make_optimizer("adam", model.parameters())
    step = compile(parallel_mode=DataParallel(style, mesh=mesh, input="global"))(fn)
    step(model, opt, *batches[0])
    nodes = list(step.graph.graph.nodes)
    return {
        "kinds": dict(Counter(n.meta.get("sw_kind") for n in nodes if n.op != "output")),
        "placeholders": sorted({(n.meta["sw_kind"], n.meta.get("sw_fqn") is not None) for n in nodes if n.op == "placeholder"}),
        "regions": dict(Counter(n.meta.get("sw_region") for n in nodes if n.op == "call_function")),
        "grad_fqns": sorted({n.meta["sw_fqn"] for n in nodes if n.meta.get("sw_kind") == "grad" and n.meta.get("sw_fqn")}),
        # single-tensor in-place ops carry what they write as their kind; a fused kernel lists its writes
        "writes": sorted({(k, f) for n in nodes if n.meta.get("sw_region") == "optimizer"
                          for k, f in [(n.meta.get("sw_kind"), n.meta.get("sw_fqn")), *n.meta.get("sw_writes", [])]
                          if k in ("param", "opt_state")}),
        "names": [n for n, _ in model.named_parameters()],
    }






def mesh_first_forms(rank, world):
    """The constructor forms of earlier releases (mesh first) and the default mesh."""
    from shardwise.compile import DTensorExpandMode
    from shardwise.tensor import Shard

    mesh = worker_mesh((world,))
    dp = DataParallel(mesh, "fully_shard", (0, None))
    dp_kw = DataParallel(mesh, style="replicate", input_batch_dim=(None, None, None))  # train/dense.py's call
    ex = DTensorExpandMode(mesh, input_placements=([Shard(0)], [Shard(0)]))
    ex_default = DTensorExpandMode([[Shard(0)]])
    default = DataParallel()
    return {
        "dp": (dp.style, dp.input_batch_dim, dp.mesh is mesh, dp.input),
        "dp_kw": (dp_kw.style, dp_kw.input_batch_dim, dp_kw.mesh is mesh, dp_kw.input),
        "expand": (ex.mesh is mesh, ex.world),
        "expand_default": (ex_default.mesh.get_group() is mesh.get_group(), ex_default.world),
        "dp_default": (default.mesh.get_group() is torch.distributed.group.WORLD, default.world),
    }
