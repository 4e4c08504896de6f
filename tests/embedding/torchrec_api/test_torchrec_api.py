"""TorchRec's way of setting up a sharded model, on real gloo ranks, against the unsharded model in
plain torch: ``apply_optimizer_in_backward`` per table (winning over a sharder's ``fused_params``),
``DistributedModelParallel(model, device=..., sharders=[...])``, ``CombinedOptimizer`` + LR scheduler,
TorchRec's names for parameters, state dicts and fused-optimizer state at every world size."""

from __future__ import annotations

import contextlib
import copy
import functools
import io

import pytest
import torch
from torch import nn
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

from shardwise.embedding import (
    DistributedModelParallel, EmbeddingBagCollection, EmbeddingBagCollectionSharder, EmbeddingBagConfig,
    EmbOptimType, ShardingEnv, data_parallel, row_wise, shard, table_wise,
)
from shardwise.optim import CombinedOptimizer, KeyedOptimizerWrapper, RowWiseAdagrad, in_backward_optimizer_filter
from shardwise.sparse import KeyedJaggedTensor
from shardwise.testing import run_on_ranks

ROWS = {"a": 20, "b": 30, "c": 12}


class Model(nn.Module):
    """Three tables and a dense layer."""

    def __init__(self, device=None):
        super().__init__()
        self.ebc = EmbeddingBagCollection([EmbeddingBagConfig(n, 4, t, feature_names=["f" + t]) for t, n in ROWS.items()],
                                          init_seed=3, device=device)
        torch.manual_seed(0)
        self.top = nn.Linear(12, 1)

    def forward(self, kjt):
        return self.top(self.ebc(kjt).values()).squeeze(1)


def batch(step: int, rank: int, n: int = 4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 3, (3 * n,), generator=g)
    values = torch.cat([torch.randint(0, rows, (int(lengths[k * n:(k + 1) * n].sum()),), generator=g)
                        for k, rows in enumerate(ROWS.values())])
    return KeyedJaggedTensor(["f" + t for t in ROWS], values, lengths=lengths), torch.randn(n, generator=g)


def _full(dmp) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v.detach()) for k, v in dmp.state_dict().items()}


def train_worker(rank, world, same_types):
    model = Model()
    ref = copy.deepcopy(model)
    bags = model.ebc.embedding_bags
    apply_optimizer_in_backward(RowWiseAdagrad, [bags["a"].weight], {"lr": 0.1})
    apply_optimizer_in_backward(torch.optim.Adagrad, [bags["b"].weight], {"lr": 0.2})
    # "c" has no setting of its own: the sharder's fused_params apply (and lose to a and b's own)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.3})
    plan = {"ebc": {"a": row_wise(), "b": table_wise(world - 1), "c": data_parallel()}}
    if same_types:   # three optimizers in one sharding type: three lookup groups of it
        plan = {"ebc": {"a": row_wise(), "b": row_wise(), "c": row_wise()}}
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda ps: torch.optim.SGD(ps, lr=0.05))
    opt = CombinedOptimizer([dmp.fused_optimizer, dense])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    rb = ref.ebc.embedding_bags
    ref_opts = [RowWiseAdagrad([rb["a"].weight], lr=0.1), torch.optim.Adagrad([rb["b"].weight], lr=0.2),
                torch.optim.SGD([rb["c"].weight], lr=0.3), torch.optim.SGD(ref.top.parameters(), lr=0.05)]
    ref_scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5 ** s) for o in ref_opts]
    for step in range(3):
        kjt, y = batch(step, rank)
        opt.zero_grad()
        ((dmp(kjt) - y) ** 2).mean().backward()
        opt.step()
        sched.step()
        for o in ref_opts:
            o.zero_grad()
        (sum(((ref(k) - t) ** 2).mean() for k, t in (batch(step, r) for r in range(world))) / world).backward()
        for o, s in zip(ref_opts, ref_scheds):
            o.step()
            s.step()
    got, want = _full(dmp), ref.state_dict()
    errs = {k: (got[k] - want[k]).abs().max().item() for k in want}
    lrs = [g["lr"] for g in opt.param_groups], [o.param_groups[0]["lr"] for o in ref_opts]
    return errs, lrs, repr(dmp.fused_optimizer), repr(dmp.module.ebc)


@pytest.mark.parametrize("same_types", [False, True])
def test_apply_optimizer_in_backward_fused_params_and_scheduler_train_like_plain_torch(same_types):
    for errs, (lrs, ref_lrs), opt_repr, ebc_repr in run_on_ranks(train_worker, 2, same_types, timeout=120.0):
        assert max(errs.values()) < 1e-6, errs
        assert lrs == ref_lrs == [0.1 / 8, 0.2 / 8, 0.3 / 8, 0.05 / 8]   # LambdaLR drove every fused group
        assert "RowWiseAdagrad(lr=0.0125" in opt_repr and "for ['a']" in opt_repr and "SGD(lr=0.0375" in opt_repr
        assert "a: 20x4 row_wise on ranks [0, 1], RowWiseAdagrad" in ebc_repr
        if not same_types:
            assert "b: 30x4 table_wise on ranks [1], Adagrad" in ebc_repr and "c: 12x4 data_parallel" in ebc_repr


# Verified against TorchRec 1.8 (torch 2.13 CPU, fbgemm-gpu-cpu 1.8, gloo) with the same model --
# EmbeddingBagCollection of tables "t", "u" (4 columns) under "ebc", nn.Linear(8, 1) under "top",
# apply_optimizer_in_backward(torchrec.optim.RowWiseAdagrad, ebc.parameters(), {"lr": 0.5}),
# DistributedModelParallel(m, device=torch.device("cpu")) -- at world sizes 1, 2 and 3:
TORCHREC_STATE_DICT = ["ebc.embedding_bags.t.weight", "ebc.embedding_bags.u.weight", "top.bias", "top.weight"]
TORCHREC_NAMED_PARAMETERS = ["ebc.embedding_bags.t.weight", "ebc.embedding_bags.u.weight", "top.weight", "top.bias"]
TORCHREC_FUSED_STATE = {"ebc.embedding_bags.t.weight": ["t.momentum1"], "ebc.embedding_bags.u.weight": ["u.momentum1"]}
# (TorchRec's state_dict lists top.bias before top.weight; ours keeps the module's order, so compared sorted.
#  TorchRec's fused state holds only the rank's own tables -- both at world 1 -- ours every table on every rank.)


class TorchRecShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"]),
                                           EmbeddingBagConfig(12, 4, "u", feature_names=["g"])], device="meta")
        self.top = nn.Linear(8, 1)

    def forward(self, kjt):
        return self.top(self.ebc(kjt).values())


def keys_worker(rank, world):
    m = TorchRecShape()
    apply_optimizer_in_backward(RowWiseAdagrad, m.ebc.parameters(), {"lr": 0.5})
    dmp = DistributedModelParallel(m, device=torch.device("cpu"))
    sd = dmp.state_dict()
    fused = {k: sorted(v) for k, v in dmp.fused_optimizer.state_dict()["state"].items()}
    # a state dict saved with the names before this change (wrapper prefixes) still loads, mapped
    old = {("module.module." if world > 1 else "module.") + k: v.full_tensor() if hasattr(v, "full_tensor") else
           v.detach().clone() + 1 for k, v in sd.items()}
    dmp.load_state_dict(old)
    loaded = {k: torch.equal(_full(dmp)[k], old[("module.module." if world > 1 else "module.") + k]) for k in sd}
    torch.optim.Adagrad(dmp.parameters(), lr=0.1)   # eager state: the tables (ShardedTable views) stay out
    got = list(dmp.parameters())
    dense_params = len(got) == 2 and got[0] is m.top.weight and got[1] is m.top.bias
    return list(sd), [k for k, _ in dmp.named_parameters()], fused, loaded, \
        [k for k, _ in in_backward_optimizer_filter(dmp.named_parameters())], dense_params


@pytest.mark.parametrize("world", [1, 2, 3])
def test_keys_are_torchrecs_at_every_world_size(world):
    for sd, named, fused, loaded, dense, dense_params in run_on_ranks(keys_worker, world, timeout=120.0):
        assert dense_params     # ours: parameters() is the dense part (TorchRec's lists the tables too)
        assert sorted(sd) == TORCHREC_STATE_DICT
        assert named == TORCHREC_NAMED_PARAMETERS
        assert fused == TORCHREC_FUSED_STATE
        assert all(loaded.values()), loaded
        assert dense == ["top.weight", "top.bias"]


def default_worker(rank, world):
    model = Model()
    ref = copy.deepcopy(model)
    env = ShardingEnv.from_process_group(torch.distributed.group.WORLD)
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        dmp = DistributedModelParallel(model, env, plan={"ebc": {t: table_wise(i % world) for i, t in enumerate(ROWS)}},
                                       init_data_parallel=False)
    kjt, _ = batch(0, rank)
    dmp(kjt).sum().backward()
    ref_opt = torch.optim.SGD(ref.ebc.parameters(), lr=0.01)
    (sum(ref(batch(0, r)[0]).sum() for r in range(world)) / world).backward()
    ref_opt.step()
    got = _full(dmp)
    return max((got[k] - v).abs().max().item() for k, v in ref.ebc.state_dict(prefix="ebc.").items()), said.getvalue()


def test_dmp_without_any_optimizer_trains_with_torchrecs_default_and_says_so():
    # TorchRec 1.8 on CPU, checked: fused tables get FBGEMM's EXACT_SGD at lr 0.01 (its fused optimizer
    # shows one group with lr 0.01 and no state), data-parallel ones no fused optimizer at all
    results = run_on_ranks(default_worker, 2, timeout=120.0)
    for err, _ in results:
        assert err < 1e-7
    assert "tables ['ebc.a', 'ebc.b', 'ebc.c']" in results[0][1] and "SGD(lr=0.01)" in results[0][1]
    assert results[1][1] == ""      # said once, by rank 0


def refusal_worker(rank, world, case):
    model = Model()
    bags = model.ebc.embedding_bags
    kwargs = {"device": torch.device("cpu")}
    if case == "two_settings":
        apply_optimizer_in_backward(torch.optim.SGD, [bags["a"].weight], {"lr": 0.1})
        apply_optimizer_in_backward(torch.optim.SGD, [bags["a"].weight], {"lr": 0.2})
    elif case == "unsupported":
        apply_optimizer_in_backward(torch.optim.RMSprop, [bags["b"].weight], {"lr": 0.1})
    elif case == "optimizer_vs_fused_params":
        kwargs.update(optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                      sharders=[EmbeddingBagCollectionSharder(fused_params={"learning_rate": 0.2})])
    elif case == "sharding_type":
        kwargs.update(plan={"ebc": {t: row_wise() for t in ROWS}},
                      sharders=[EmbeddingBagCollectionSharder(sharding_types=["table_wise", "data_parallel"])])
    elif case == "fused_type":
        kwargs.update(sharders=[EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.LAMB})])
    elif case == "device":
        kwargs.update(device=torch.device("meta"))
    elif case == "plan_positional":
        return _raises(lambda: DistributedModelParallel(model, {"ebc": {}}))
    return _raises(lambda: DistributedModelParallel(model, **kwargs)) + (type(model.ebc).__name__,)


def _raises(fn):
    try:
        fn()
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)
    return None, None


@pytest.mark.parametrize("case, pattern", [
    ("two_settings", r"DistributedModelParallel, collection 'ebc': table 'a' has 2 different optimizers"),
    ("unsupported", r"table 'b': its apply_optimizer_in_backward setting RMSprop.*supported: SGD, Adagrad, Adam, AdamW"),
    ("optimizer_vs_fused_params", r"optimizer= gives SGD\(lr=0.1.*fused_params give SGD\(lr=0.2"),
    ("sharding_type", r"tables \{'a': 'row_wise'.*allowed: \['data_parallel', 'table_wise'\]"),
    ("fused_type", r"fused optimizer 'lamb' is not supported fused here; supported EmbOptimType values"),
    ("plan_positional", r"the second argument is env .* pass the plan by keyword"),
    ("device", r"^DistributedModelParallel: device=meta: sharded collections run on 'cpu' or 'cuda' devices"),
])
def test_bad_optimizer_settings_are_refused_naming_dmp_and_the_table(case, pattern):
    import re
    results = run_on_ranks(refusal_worker, 2, case, timeout=120.0)
    assert results[0][:2] == results[1][:2]
    kind, msg = results[0][:2]
    assert kind is not None and re.search(pattern, msg), msg
    if case != "plan_positional":      # raised before any collection was replaced
        assert results[0][2] == "EmbeddingBagCollection"


def frozen_worker(rank, world):
    import warnings
    ebc = Model().ebc
    sharded = shard(ebc, {t: row_wise() for t in ROWS})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(2):
            sharded(batch(step, rank)[0]).values().sum().backward()
    return [str(w.message) for w in seen if "no optimizer" in str(w.message)]


def test_shard_without_optimizer_warns_once_when_a_backward_reaches_it():
    for msgs in run_on_ranks(frozen_worker, 2, timeout=120.0):
        assert len(msgs) == 1 and "tables ['a', 'b', 'c']" in msgs[0] and "do not change" in msgs[0]


def legacy_checkpoint_worker(rank, world, path):
    import torch.distributed.checkpoint as dcp

    from shardwise.embedding.checkpoint import load_sharded

    adam = functools.partial(torch.optim.Adam, lr=0.05)
    a = shard(Model().ebc, {"a": row_wise(), "b": table_wise(0), "c": data_parallel()}, optimizer=adam)
    for step in range(2):
        a(batch(step, rank)[0]).values().pow(2).sum().backward()
    # the layout written before the fused state took TorchRec's names: {"step", "exp_avg", "exp_avg_sq"}
    old_names = {"momentum1": "exp_avg", "momentum2": "exp_avg_sq", "step": "step"}
    optim = {key: {old_names[n.rsplit(".", 1)[1]]: v for n, v in entry.items()}
             for key, entry in a.fused_optimizer.state_dict()["state"].items()}
    dcp.save({"model": a.state_dict(), "optim": {"state": optim, "param_groups": [{"lr": 0.05}]}}, checkpoint_id=path)
    b = shard(Model(device="meta").ebc, {"a": table_wise(world - 1), "b": row_wise(), "c": row_wise()}, optimizer=adam)
    load_sharded(path, b)
    full = lambda m: {f"{k}/{n}": (v.full_tensor() if hasattr(v, "full_tensor") else v)    # noqa: E731
                      for k, e in m.fused_optimizer.state_dict()["state"].items() for n, v in e.items()}
    fa, fb = full(a), full(b)
    same_state = sorted(fa) == sorted(fb) and all(torch.equal(fa[k], fb[k]) for k in fa)
    same_weights = all(torch.equal(v.full_tensor(), b.state_dict()[k].full_tensor()) for k, v in a.state_dict().items())
    c = shard(Model(device="meta").ebc, {t: row_wise() for t in ROWS}, optimizer=adam)
    c.fused_optimizer.load_state_dict({"state": optim})       # an older in-memory state dict, too
    fc = full(c)
    same_state = same_state and all(torch.equal(fa[k], fc[k]) for k in fa)
    return same_state, same_weights, float(fb["embedding_bags.a.weight/a.step"])


def test_checkpoint_with_the_older_state_names_still_loads(tmp_path):
    for same_state, same_weights, step in run_on_ranks(legacy_checkpoint_worker, 2, str(tmp_path / "ckpt"),
                                                       timeout=120.0):
        assert same_state and same_weights and step == 2.0


def sharder_shard_worker(rank, world):
    ebc = Model().ebc
    ref = copy.deepcopy(ebc)
    env = ShardingEnv.from_process_group(torch.distributed.group.WORLD)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.2})
    sharded = sharder.shard(ebc, {"a": row_wise(), "b": table_wise(0), "c": table_wise(world - 1)}, env,
                            torch.device("cpu"))
    kjt, _ = batch(0, rank)
    forward_err = (sharded(kjt).values() - ebc(kjt).values()).abs().max().item()
    sharded(kjt).values().pow(2).sum().backward()
    ref_opt = torch.optim.Adagrad(ref.parameters(), lr=0.2, eps=1e-8)     # FBGEMM's eps default
    (sum(ref(batch(0, r)[0]).values().pow(2).sum() for r in range(world)) / world).backward()
    ref_opt.step()
    got = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    return forward_err, max((got[k] - v).abs().max().item() for k, v in ref.state_dict().items())


def test_sharder_shard_as_in_torchrecs_tutorial_honours_its_fused_params():
    for forward_err, err in run_on_ranks(sharder_shard_worker, 2, timeout=120.0):
        assert forward_err == 0.0 and err < 1e-6


def mixed_reshard_worker(rank, world):
    from shardwise.embedding import reshard

    model = Model()
    apply_optimizer_in_backward(torch.optim.Adagrad, [model.ebc.embedding_bags["a"].weight], {"lr": 0.2})
    sharded = shard(model.ebc, {t: row_wise() for t in ROWS}, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    before = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    try:
        reshard(sharded, {"b": table_wise(0)})
    except ValueError as exc:
        return str(exc), all(torch.equal(v, sharded.state_dict()[k].full_tensor()) for k, v in before.items())
    return None, None


def test_reshard_of_tables_with_different_optimizers_is_refused_before_moving_anything():
    for msg, unchanged in run_on_ranks(mixed_reshard_worker, 2, timeout=120.0):
        assert msg and "different optimizers (Adagrad(lr=0.2, eps=1e-10) for ['a']; SGD(lr=0.1) for ['b', 'c'])" in msg, msg
        assert unchanged
