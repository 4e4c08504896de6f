"""Sharded embedding-bag collections vs the unsharded module in plain single-process PyTorch."""

import pytest

from shardwise.testing import run_on_ranks

from . import common, workers

PLANS = ["table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise", "mixed", "mixed2"]


@pytest.mark.parametrize("world, hosts", [(2, 1), (3, 1), (4, 2)])
def test_forward_matches_unsharded(world, hosts):
    # every plan x weighted/unweighted x 2 batches (sum+mean tables, empty bags, absent features,
    # different batch sizes per rank, a table with fewer rows than ranks)
    results = run_on_ranks(workers.forward_all_plans, world, hosts, PLANS, [False, True])
    for rank, errors in enumerate(results):
        assert len(errors) == len(PLANS) * 4
        bad = {k: v for k, v in errors.items() if v > 1e-5}
        assert not bad, f"rank {rank}: {bad}"


@pytest.mark.parametrize("world, hosts, cases", [
    (2, 1, [(common.SGD, True), (common.ADAGRAD, False)]),
    (3, 1, [(common.SGD, False), (common.ADAGRAD, True)]),
    (4, 2, [(common.SGD, False), (common.ADAGRAD, True)]),
])
def test_training_matches_dense_optimizer(world, hosts, cases):
    # 3 steps of fused SGD / Adagrad == torch.optim on the unsharded module, global batch, mean of the
    # per-rank losses (gradient division, the default)
    results = run_on_ranks(workers.train_all_plans, world, hosts, PLANS, cases, timeout=300.0,
                           chunk_elements=16 if world == 3 else None)
    for rank, errors in enumerate(results):
        assert len(errors) == len(PLANS) * len(cases)
        for key, (err, moved) in errors.items():
            assert moved > 1e-3, f"reference did not train for {key}"
            assert err < 1e-5, f"rank {rank} {key}: max weight error {err}"


def test_training_adam_and_row_wise_adagrad():
    # Adam: torch.optim.Adam's own step on the touched rows; RowWiseAdagrad: its dense form.
    from shardwise.embedding import RowWiseAdagrad
    import functools

    rwa = functools.partial(RowWiseAdagrad, lr=0.1)
    no_cw = ["table_wise", "row_wise", "data_parallel", "table_row_wise"]
    # chunk_elements=8: the CPU update runs in 1-2 row chunks, so chunking is exercised too
    results = run_on_ranks(workers.train_all_plans, 2, 1, no_cw, [(common.ADAM, True), (rwa, False)],
                           timeout=300.0, chunk_elements=8)
    for rank, errors in enumerate(results):
        assert len(errors) == 2 * len(no_cw)
        for key, (err, moved) in errors.items():
            assert moved > 1e-3, f"reference did not train for {key}"
            assert err < 1e-5, f"rank {rank} {key}: max weight error {err}"


def test_shard_errors_are_clear_and_identical_on_ranks():
    results = run_on_ranks(workers.shard_errors, 2)
    assert results[0] == results[1]
    msgs = results[0]
    assert "missing ['t_a']" in msgs["missing"]
    assert "names rank 2 but the mesh has 2 ranks" in msgs["rank"]
    assert "host_index=5 but the mesh has 1 host" in msgs["host"]
    assert "RowWiseAdagrad keeps one accumulator per row" in msgs["rowwise_cw"]
    assert msgs["type"].startswith("TypeError") and "must be a ParameterSharding" in msgs["type"]
    assert "weights have different dtypes {'torch.float16': ['t_b'], 'torch.float32': ['t_a', 't_tiny', 't_c']}" in \
        msgs["dtypes"]
    for case in ("cast", "meta_cast"):      # a table cast with .half(), also on the meta device
        assert "weights have different dtypes {'torch.float16': ['t_c'], 'torch.float32': ['t_a', 't_b', 't_tiny']}" \
            in msgs[case], msgs[case]
    assert "weights have different dtypes" in msgs["broadcast"] and msgs["broadcast_untouched"]  # before src_rank's
    assert "ranks [1] were given other tables" in msgs["one_rank_cast"] and "differ in dtype" in msgs["one_rank_cast"]


def test_compiled_optimizer_kernels():
    # compile_optimizer=True: the torch.compile'd kernels give the same training as the references
    from shardwise.embedding import RowWiseAdagrad
    import functools

    cases = [(common.ADAGRAD, True), (common.ADAM, False), (common.SGD, False),
             (functools.partial(RowWiseAdagrad, lr=0.1), False)]
    results = run_on_ranks(workers.train_all_plans, 2, 1, ["table_wise"], cases, 2, True, timeout=600.0)
    for rank, errors in enumerate(results):
        assert len(errors) == len(cases)
        for key, (err, moved) in errors.items():
            assert moved > 1e-3 and err < 1e-5, f"rank {rank} {key}: error {err}, moved {moved}"


def test_compiled_kernels_divide_gradients_inside_the_update():
    # the gradient division (1/2 here) is the compiled kernel's last coefficient; weighted SGD on
    # every pooled sharding type against the dense reference. SGD because its step is proportional
    # to the gradient (Adagrad's barely moves with a scale); world 2 reuses the worker pool (and the
    # kernel compiled by the test above), which keeps the suite short.
    cases = [(common.SGD, True)]
    plans = ["table_wise", "row_wise", "column_wise"]
    results = run_on_ranks(workers.train_all_plans, 2, 1, plans, cases, 2, True, timeout=600.0)
    for rank, errors in enumerate(results):
        assert len(errors) == len(cases) * len(plans)
        for key, (err, moved) in errors.items():
            assert moved > 1e-3 and err < 1e-5, f"rank {rank} {key}: error {err}, moved {moved}"


def test_bad_batch_on_one_rank_raises_on_every_rank():
    results = run_on_ranks(workers.forward_errors, 2)
    (msgs0, err0), (msgs1, err1) = results
    assert msgs0 == msgs1, "ranks must raise identical errors"
    assert "rank(s) [1]" in msgs0[0] and "features ['nope'] are not looked up" in msgs0[0]
    assert "rank(s) [0]" in msgs0[1] and "id 7 of feature 'fb' is outside its table's rows [0, 7)" in msgs0[1]
    assert err0 < 1e-6 and err1 < 1e-6


def division_switch(rank, world):
    """SGD on every plan type: the default divides by the world size (the mean of per-rank losses),
    gradient_division=False sums (the summed losses); each against its own dense reference."""
    from shardwise.embedding import shard

    mesh = workers.mesh_for(world, 1)
    ebc = common.make_ebc(seed=4)
    out = {}
    for divided in (True, False):
        want = common.reference_train(ebc, common.SGD, world, 2, False, divided=divided)
        sharded = shard(ebc, common.plans(world, 1)["mixed"], mesh=mesh, optimizer=common.SGD,
                        gradient_division=divided)
        for step in range(2):
            batches = common.rank_batches(world, step, False)
            tgts = common.targets(world, step, [b.stride() for b in batches],
                                  sum(d * len(f) for _, _, d, f, _ in common.TABLES))
            common.loss_fn(sharded(batches[rank]), tgts[rank]).backward()
        sd = sharded.state_dict()
        out[divided] = max((sd[f"embedding_bags.{t}.weight"].full_tensor() - w).abs().max().item()
                           for t, w in want.items())
    other = common.reference_train(ebc, common.SGD, world, 2, False, divided=False)
    gap = max((other[t] - w).abs().max().item() for t, w in common.reference_train(
        ebc, common.SGD, world, 2, False).items())
    try:
        shard(ebc, common.plans(world, 1)["mixed"], mesh=mesh, gradient_division="yes")
        bad = None
    except TypeError as exc:
        bad = str(exc)
    return out, gap, bad


@pytest.mark.parametrize("world", [2, 3])
def test_gradient_division_is_the_default_and_can_be_switched_off(world):
    for out, gap, bad in run_on_ranks(division_switch, world, timeout=120.0):
        assert out[True] < 1e-6 and out[False] < 1e-6, out
        assert gap > 1e-4          # the two references differ, so each comparison can fail
        assert bad is not None and "gradient_division='yes'" in bad


def half_tables(rank, world):
    """fp16 / bf16 tables: weights in that dtype, optimizer state in fp32, training close to the same
    tables in fp32 (SGD: Adagrad's first step is +-lr whatever the gradient's size, so a sign flip of a
    tiny gradient in half precision would be a full step), and a reshard moves both dtypes bit for bit."""
    import functools

    import torch

    from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, reshard, row_wise, shard, table_wise

    mesh = workers.mesh_for(world, 1)
    adagrad = functools.partial(torch.optim.Adagrad, lr=0.1)
    out = {}
    for dt in ("FP16", "BF16"):
        mods = {}
        for name in (dt, "FP32", dt + "/sgd", "FP32/sgd"):
            cfgs = [EmbeddingBagConfig(n, d, t, name.split("/")[0], list(f), pooling=p)
                    for t, n, d, f, p in common.TABLES]
            ebc = EmbeddingBagCollection(cfgs, init_seed=8)
            plan = {t: (table_wise(i % world) if i % 2 else row_wise()) for i, (t, *_) in enumerate(common.TABLES)}
            mods[name] = shard(ebc, plan, mesh=mesh, optimizer=common.SGD if "sgd" in name else adagrad)
            for step in range(2):
                batches = common.rank_batches(world, step, False)
                tgts = common.targets(world, step, [b.stride() for b in batches],
                                      sum(d * len(f) for _, _, d, f, _ in common.TABLES))
                common.loss_fn(mods[name](batches[rank]), tgts[rank]).float().backward()
        half = mods[dt]
        sd, opt = half.state_dict(), half.fused_optimizer.state_dict()["state"]
        w = sd["embedding_bags.t_a.weight"].full_tensor()
        s = opt["embedding_bags.t_a.weight"]["t_a.momentum1"].full_tensor()
        err = max((mods[dt + "/sgd"].state_dict()[k].full_tensor().float() - v.full_tensor()).abs().max().item()
                  for k, v in mods["FP32/sgd"].state_dict().items())
        before = {k: v.full_tensor() for k, v in sd.items()}
        stats = reshard(half, {t: table_wise((i + 1) % world) for i, (t, *_) in enumerate(common.TABLES)})
        after = {k: v.full_tensor() for k, v in half.state_dict().items()}
        sums = half.fused_optimizer.state_dict()["state"]["embedding_bags.t_a.weight"]["t_a.momentum1"].full_tensor()
        out[dt] = (str(w.dtype), str(s.dtype), err, all(torch.equal(before[k], after[k]) for k in before),
                   torch.equal(s, sums), stats.bytes_sent)
    return out


def test_half_precision_tables_keep_fp32_state():
    for out in run_on_ranks(half_tables, 2, timeout=180.0):
        for dt, tol, name in (("FP16", 5e-3, "torch.float16"), ("BF16", 3e-2, "torch.bfloat16")):
            wdt, sdt, err, moved, sums, sent = out[dt]
            assert (wdt, sdt) == (name, "torch.float32")
            assert err < tol, (dt, err)
            assert moved and sums
            assert sum(sent) > 0
