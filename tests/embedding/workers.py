"""Module-level rank functions for the distributed embedding tests (run by run_on_ranks)."""

from __future__ import annotations

import torch

from shardwise.embedding import shard
from shardwise.testing import worker_mesh

from . import common


def mesh_for(world: int, hosts: int):
    return worker_mesh((hosts, world // hosts)) if hosts > 1 else worker_mesh((world,))


def forward_all_plans(rank, world, hosts, plan_names, cases):
    """Max abs error of sharded vs unsharded forward for every (plan, weighted) case."""
    mesh = mesh_for(world, hosts)
    errors = {}
    for weighted in cases:
        ebc = common.make_ebc(seed=1, weighted=weighted)
        all_plans = common.plans(world, hosts)
        for name in plan_names:
            sharded = shard(ebc, all_plans[name], mesh=mesh)
            if name == "table_row_wise" and hosts > 1:   # the two-level output dist must be in use
                assert sharded._groups[0].stages.output_dist.enabled
            for step in range(2):
                kjt = common.rank_batches(world, step, weighted)[rank]
                got = sharded(kjt)
                want = ebc(kjt)
                assert got.keys() == want.keys()
                err = (got.values() - want.values()).abs().max().item() if want.values().numel() else 0.0
                errors[(name, weighted, step)] = err
    return errors


def train_all_plans(rank, world, hosts, plan_names, cases, steps=3, compile_optimizer=False,
                    chunk_elements=None):
    """Per (plan, optimizer, weighted): max abs weight error after ``steps`` fused steps vs the dense
    unsharded reference, and how far the reference moved (so a no-op update cannot pass)."""
    from shardwise.embedding.sharding import store as shards

    mesh = mesh_for(world, hosts)
    errors = {}
    saved = shards._CHUNK_ELEMENTS
    if chunk_elements is not None:   # tiny chunks: the CPU row-chunked update path runs many chunks
        shards._CHUNK_ELEMENTS = chunk_elements
    try:
        _train_cases(rank, world, hosts, plan_names, cases, steps, compile_optimizer, mesh, errors)
    finally:
        shards._CHUNK_ELEMENTS = saved
    return errors


def _train_cases(rank, world, hosts, plan_names, cases, steps, compile_optimizer, mesh, errors):
    for optimizer, weighted in cases:
        ebc = common.make_ebc(seed=2, weighted=weighted)
        reference = common.reference_train_touched_rows if optimizer.func is torch.optim.Adam \
            else common.reference_train
        want = reference(ebc, optimizer, world, steps, weighted)
        moved = max((w - ebc.embedding_bags[t].weight).abs().max().item() for t, w in want.items())
        for name in plan_names:
            sharded = shard(ebc, common.plans(world, hosts)[name], mesh=mesh, optimizer=optimizer,
                            compile_optimizer=compile_optimizer)
            for step in range(steps):
                batches = common.rank_batches(world, step, weighted)
                tgts = common.targets(world, step, [b.stride() for b in batches],
                                      sum(d * len(f) for _, _, d, f, _ in common.TABLES))
                common.loss_fn(sharded(batches[rank]), tgts[rank]).backward()
            sd = sharded.state_dict()
            err = 0.0
            for table, w in want.items():
                full = sd[f"embedding_bags.{table}.weight"].full_tensor()
                err = max(err, (full - w).abs().max().item())
            errors[(name, optimizer.func.__name__, weighted)] = (err, moved)


def reduce_scatter_path(rank, world):
    """Row-wise output through reduce_scatter (the NCCL path), forced on gloo, forward + training."""
    mesh = mesh_for(world, 1)
    ebc = common.make_ebc(seed=3)
    plan = {n: common.row_wise() for n, *_ in common.TABLES}
    sharded = shard(ebc, plan, mesh=mesh, optimizer=common.ADAGRAD)
    dist_stage = sharded._groups[0].stages.output_dist
    assert sharded._groups[0].routing.uniform()
    dist_stage.enabled = True   # normally only on CUDA, where reduce-scatter beats all-to-all
    want = common.reference_train(ebc, common.ADAGRAD, world, 2, False, equal_batches=True)
    fwd_err = 0.0
    for step in range(2):
        batches = common.rank_batches(world, step, False, equal_batches=True)
        out = sharded(batches[rank])
        if step == 0:
            fwd_err = (out.values() - ebc(batches[rank]).values()).abs().max().item()
        tgts = common.targets(world, step, [b.stride() for b in batches],
                              sum(d * len(f) for _, _, d, f, _ in common.TABLES))
        common.loss_fn(out, tgts[rank]).backward()
    sd = sharded.state_dict()
    err = max((sd[f"embedding_bags.{t}.weight"].full_tensor() - w).abs().max().item() for t, w in want.items())
    return fwd_err, err


def state_round_trip(rank, world, ckpt_dir):
    """state_dict / load_state_dict (same plan, other plan, plain tensors), optimizer state, and a
    torch.distributed.checkpoint save/load; returns named max errors (all must be ~0)."""
    import torch
    import torch.distributed.checkpoint as dcp

    mesh = mesh_for(world, 1)
    errs = {}
    for name in ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed"]:
        plan = common.plans(world)[name]
        a = shard(common.make_ebc(seed=4), plan, mesh=mesh, optimizer=common.ADAGRAD)
        _train(a, rank, world, steps=1)
        sd, osd = a.state_dict(), a.fused_optimizer.state_dict()
        full = {k: v.full_tensor() for k, v in sd.items()}
        b = shard(common.make_ebc(seed=5), plan, mesh=mesh, optimizer=common.ADAGRAD)
        b.load_state_dict(sd)
        b.optimizer.load_state_dict(osd)   # the alias of fused_optimizer
        errs[(name, "same plan")] = _max_diff(full, b.state_dict())
        other = shard(common.make_ebc(seed=6), common.plans(world)["mixed2"], mesh=mesh)
        other.load_state_dict(sd)
        errs[(name, "other plan")] = _max_diff(full, other.state_dict())
        plain = shard(common.make_ebc(seed=7), plan, mesh=mesh)
        plain.load_state_dict(full)
        errs[(name, "plain tensors")] = _max_diff(full, plain.state_dict())
        _train(a, rank, world, steps=1, first=1)
        _train(b, rank, world, steps=1, first=1)
        errs[(name, "optimizer state")] = _max_diff({k: v.full_tensor() for k, v in a.state_dict().items()},
                                                    b.state_dict())
        path = f"{ckpt_dir}/{name}"
        dcp.save({"model": a.state_dict(), "optim": a.fused_optimizer.state_dict()}, checkpoint_id=path)
        c = shard(common.make_ebc(seed=8), plan, mesh=mesh, optimizer=common.ADAGRAD)
        target = {"model": c.state_dict(), "optim": c.fused_optimizer.state_dict()}
        dcp.load(target, checkpoint_id=path)
        c.load_state_dict(target["model"])
        c.fused_optimizer.load_state_dict(target["optim"])
        errs[(name, "dcp weights")] = _max_diff({k: v.full_tensor() for k, v in a.state_dict().items()},
                                                c.state_dict())
        _train(a, rank, world, steps=1, first=2)
        _train(c, rank, world, steps=1, first=2)
        errs[(name, "dcp then train")] = _max_diff({k: v.full_tensor() for k, v in a.state_dict().items()},
                                                   c.state_dict())
        errs[(name, "moved")] = -_max_diff(full, a.state_dict())  # negative: must have trained
    del torch
    return errs


def _train(sharded, rank, world, steps, first=0):
    for step in range(first, first + steps):
        batches = common.rank_batches(world, step, False)
        tgts = common.targets(world, step, [b.stride() for b in batches],
                              sum(d * len(f) for _, _, d, f, _ in common.TABLES))
        common.loss_fn(sharded(batches[rank]), tgts[rank]).backward()


def _max_diff(full: dict, sd: dict) -> float:
    return max((sd[k].full_tensor() - v).abs().max().item() for k, v in full.items())


def shard_errors(rank, world):
    """Messages of the errors shard() raises for bad plans (raised identically on every rank)."""
    import dataclasses
    import functools

    from shardwise.embedding import EmbeddingBagCollection, RowWiseAdagrad, column_wise, table_row_wise, table_wise

    ebc = common.make_ebc(seed=0)
    good = common.plans(world)["table_wise"]
    cases = {
        "missing": {k: v for k, v in good.items() if k != "t_a"},
        "rank": {**good, "t_a": table_wise(world)},
        "host": {**good, "t_a": table_row_wise(5)},
        "rowwise_cw": {**good, "t_a": column_wise([0, 1])},
        "type": {**good, "t_a": "table_wise"},
        "dtypes": good, "cast": good, "meta_cast": good, "broadcast": good, "one_rank_cast": good,
    }
    # one fp16 table among fp32 ones: a sharded collection stores one weight dtype
    mixed = EmbeddingBagCollection([dataclasses.replace(t, data_type="FP16") if t.name == "t_b" else t
                                    for t in ebc.tables], init_seed=0)
    cast, meta_cast, one_rank = common.make_ebc(seed=0), common.make_ebc(seed=0, device="meta"), common.make_ebc(seed=0)
    for m in (cast, meta_cast):
        m.embedding_bags["t_c"].half()       # the configs still say FP32: the weights' dtype decides
    if rank == 1:
        one_rank.embedding_bags["t_c"].half()
    # ranks hold other weights: had src_rank's broadcast run before the refusal, they would be rank 0's
    theirs = common.make_ebc(seed=rank)
    theirs.embedding_bags["t_b"].half()
    before = {k: v.clone() for k, v in theirs.state_dict().items()}
    modules = {"dtypes": mixed, "cast": cast, "meta_cast": meta_cast, "broadcast": theirs, "one_rank_cast": one_rank}
    out = {}
    for name, plan in cases.items():
        opt = functools.partial(RowWiseAdagrad, lr=0.1) if name == "rowwise_cw" else None
        try:
            shard(modules.get(name, ebc), plan, mesh=mesh_for(world, 1), optimizer=opt,
                  src_rank=0 if name == "broadcast" else None)
            out[name] = None
        except (ValueError, TypeError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    out["broadcast_untouched"] = all(torch.equal(v, theirs.state_dict()[k]) for k, v in before.items())
    return out


def planner_plan_runs(rank, world, data_type="FP32"):
    """(estimated bytes, real bytes of local shards + optimizer state, forward error) on this rank;
    every table's weights in ``data_type`` (the optimizer state stays fp32)."""
    import dataclasses

    from shardwise.embedding import EmbeddingBagCollection, GreedyShardingPlanner

    tables = [dataclasses.replace(t, data_type=data_type) for t in common.make_ebc().tables]
    ebc = EmbeddingBagCollection(tables, init_seed=9)
    planner = GreedyShardingPlanner(world, 600, batch_size_per_rank=3, ids_per_bag=1.5, optimizer="adagrad",
                                       data_parallel_max_rows=4)
    plan = planner.plan(ebc.tables)
    est = planner.estimate(plan, ebc.tables)
    sharded = shard(ebc, plan, mesh=mesh_for(world, 1), optimizer=common.ADAGRAD)
    real = 0
    for g in sharded._groups:
        for buf, state in zip(g.store.buffers, g.store.states):
            real += buf.numel() * buf.element_size() + sum(s.numel() * s.element_size() for s in state.values())
    kjt = common.rank_batches(world, 0, False)[rank]
    err = (sharded(kjt).values().float() - ebc(kjt).values().float()).abs().max().item()
    return est.memory[rank], real, err


def forward_errors(rank, world):
    """A bad batch on one rank makes every rank raise the same ValueError; the module still works."""
    from shardwise.sparse import KeyedJaggedTensor

    ebc = common.make_ebc(seed=0)
    sharded = shard(ebc, common.plans(world)["mixed"], mesh=mesh_for(world, 1))
    good = common.rank_batches(world, 0, False)[rank]
    unknown = KeyedJaggedTensor(["nope"], torch.tensor([1]), lengths=torch.tensor([1]))
    out_of_range = KeyedJaggedTensor(["fb"], torch.tensor([0, 7]), lengths=torch.tensor([2]))
    messages = []
    for bad_rank, bad in ((1, unknown), (0, out_of_range)):
        try:
            sharded(bad if rank == bad_rank else good)
            messages.append(None)
        except ValueError as exc:
            messages.append(str(exc))
    err = (sharded(good).values() - ebc(good).values()).abs().max().item()
    return messages, err


def dtensor_state_dict(rank, world):
    """State dict through our DTensor (forced on even without its checkpoint protocol): which keys
    became DTensors, and the max error of full_tensor() and of a load_state_dict round trip."""
    from shardwise.embedding import state_dict as state_mod
    from shardwise.tensor import DTensor, Replicate, Shard

    mesh = mesh_for(world, 1)
    original = state_mod._dtensor_api
    state_mod._dtensor_api = lambda: (DTensor, Shard, Replicate)
    try:
        ebc = common.make_ebc(seed=11)
        plan = {"t_a": common.row_wise(), "t_b": common.data_parallel(),
                "t_tiny": common.row_wise(), "t_c": common.column_wise(list(range(world)))}
        sharded = shard(ebc, plan, mesh=mesh)
        sd = sharded.state_dict()
        kinds = {k: type(v).__name__ for k, v in sd.items()}
        err = max((sd[f"embedding_bags.{t}.weight"].full_tensor() - ebc.embedding_bags[t].weight).abs().max().item()
                  for t in plan)
        other = shard(common.make_ebc(seed=12), plan, mesh=mesh)
        other.load_state_dict(sd)
        err2 = max((other.state_dict()[k].full_tensor() - v.full_tensor()).abs().max().item() for k, v in sd.items())
    finally:
        state_mod._dtensor_api = original
    return kinds, err, err2
