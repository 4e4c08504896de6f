"""Rank functions for the quantized-comms tests: sharded output and training with fp16/bf16 codecs
against the unsharded fp32 module, and the bytes the embedding collectives put on the wire."""

from __future__ import annotations

import contextlib

import torch

from shardwise.embedding import EmbeddingCollection, EmbeddingConfig, shard
from shardwise.embedding.qcomm import CommType, QCommsConfig, get_qcomm_codecs_registry

from . import common
from .workers import mesh_for

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@contextlib.contextmanager
def wire_bytes():
    """Bytes of floating-point buffers sent by the embedding output collectives (comm.py), per kind."""
    from shardwise.embedding.sharding import comm

    counts = {"all_to_all": 0, "reduce_scatter": 0, "all_gather": 0}
    real = comm.dist

    def spy(kind):
        def call(out, inp, *args, **kwargs):
            if inp.dtype in _FLOATS:
                counts[kind] += inp.numel() * inp.element_size()
            return getattr(real, kind + "_single")(out, inp, *args, **kwargs)
        return call

    class Spy:
        all_to_all_single, reduce_scatter_single, all_gather_single = (
            staticmethod(spy("all_to_all")), staticmethod(spy("reduce_scatter")), staticmethod(spy("all_gather")))

        def __getattr__(self, name):
            return getattr(real, name)

    comm.dist = Spy()
    try:
        yield counts
    finally:
        comm.dist = real


def registry(precision: str, scale=None):
    if precision == "fp32":
        return None
    fwd = bwd = CommType.FP16 if precision == "fp16" else CommType.BF16
    return get_qcomm_codecs_registry(QCommsConfig(fwd, bwd, forward_loss_scale=scale, backward_loss_scale=scale))


def train_with_qcomm(rank, world, plan_names, precisions, steps=2, force_reduce_scatter=False, hosts=1):
    """Per (plan, precision): (max forward error vs unsharded fp32, max weight error after ``steps`` SGD
    steps vs the dense reference, how far the reference moved, wire bytes of the output collectives)."""
    mesh = mesh_for(world, hosts)
    ebc = common.make_ebc(seed=4)
    want = common.reference_train(ebc, common.SGD, world, steps, False, equal_batches=True)
    moved = max((w - ebc.embedding_bags[t].weight).abs().max().item() for t, w in want.items())
    width = sum(d * len(f) for _, _, d, f, _ in common.TABLES)
    out = {}
    for name in plan_names:
        for precision in precisions:
            sharded = shard(ebc, common.plans(world, hosts)[name], mesh=mesh, optimizer=common.SGD,
                            qcomm_codecs_registry=registry(precision))
            if hosts > 1:   # the two-level output dist must be in use
                assert sharded._groups[0].stages.output_dist.enabled
            if force_reduce_scatter:   # the NCCL path, forced on gloo (as test_sharded does)
                sharded._groups[0].stages.output_dist.enabled = True
            fwd_err = 0.0
            with wire_bytes() as sent:
                for step in range(steps):
                    batches = common.rank_batches(world, step, False, equal_batches=True)
                    got = sharded(batches[rank])
                    if step == 0:
                        fwd_err = (got.values() - ebc(batches[rank]).values()).abs().max().item()
                    tgts = common.targets(world, step, [b.stride() for b in batches], width)
                    common.loss_fn(got, tgts[rank]).backward()
            sd = sharded.state_dict()
            err = max((sd[f"embedding_bags.{t}.weight"].full_tensor() - w).abs().max().item() for t, w in want.items())
            out[(name, precision)] = (fwd_err, err, moved, dict(sent))
    return out


def sequence_with_qcomm(rank, world):
    """EmbeddingCollection (sequence all-to-all), row-wise: rows vs unsharded, wire bytes fp32/fp16."""
    from shardwise.embedding import row_wise
    from shardwise.sparse import KeyedJaggedTensor

    ec = EmbeddingCollection([EmbeddingConfig(13, 8, "t", feature_names=["f"])], init_seed=5)
    kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 12, 5, 7, 1][: 3 + rank]), lengths=torch.tensor([2, 1 + rank]))
    out = {}
    for precision in ("fp32", "fp16"):
        sharded = shard(ec, {"t": row_wise()}, mesh=mesh_for(world, 1), qcomm_codecs_registry=registry(precision))
        with wire_bytes() as sent:
            got = sharded(kjt)["f"].values()
        out[precision] = ((got - ec(kjt)["f"].values()).abs().max().item(), sent["all_to_all"])
    return out


def mismatched_registry(rank, world):
    """Rank 1 asks for fp16, rank 0 for nothing: every rank raises the same error, through shard()'s
    digest and through use_qcomm() on a built module (DMP's way in); the same registry everywhere works."""
    from shardwise.embedding.torchrec_api.sharded_api import use_qcomm

    mine = registry("fp16") if rank == 1 else None
    out = []
    try:
        shard(common.make_ebc(), common.plans(world)["row_wise"], mesh=mesh_for(world, 1), qcomm_codecs_registry=mine)
        out.append("no error")
    except ValueError as exc:
        out.append(str(exc))
    sharded = shard(common.make_ebc(), common.plans(world)["row_wise"], mesh=mesh_for(world, 1))
    try:
        use_qcomm(sharded, mine)
        out.append("no error")
    except ValueError as exc:
        out.append(str(exc).split(" (this rank")[0])
    use_qcomm(sharded, registry("fp16"))
    out.append(repr(sharded._output_dists[0].codecs.forward))
    return out


def reshard_keeps_codecs(rank, world):
    """After a reshard (new groups are built) the output dist still carries the codecs."""
    from shardwise.embedding import table_wise

    sharded = shard(common.make_ebc(), common.plans(world)["row_wise"], mesh=mesh_for(world, 1),
                    qcomm_codecs_registry=registry("bf16"))
    sharded.reshard({"t_a": table_wise(1)})
    return sorted(repr(g.stages.output_dist.codecs.forward) for g in sharded._groups)


def dmp_with_qcomm_sharder(rank, world):
    """TorchRec's way in: DistributedModelParallel(ebc, device=, sharders=[EmbeddingBagCollectionSharder(
    qcomm_codecs_registry=...)]); every output dist carries the codecs, the output is within fp16 of the
    unsharded module's and the output collectives send half the bytes of an fp32 DMP."""
    from shardwise.embedding import DistributedModelParallel, EmbeddingBagCollectionSharder

    ebc = common.make_ebc(seed=8)
    kjt = common.rank_batches(world, 0, False)[rank]
    want = ebc(kjt).values()
    out = {}
    for precision in ("fp32", "fp16"):
        sharder = EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry(precision))
        model = DistributedModelParallel(ebc, device=torch.device("cpu"), sharders=[sharder],
                                         plan={"": common.plans(world)["table_wise"]})
        sharded = next(iter(model.sharded_modules.values()))   # a property: {path: sharded module}
        with wire_bytes() as sent:
            got = model(kjt).wait().values()
        out[precision] = ((got - want).abs().max().item(), sent["all_to_all"],
                          sorted({repr(getattr(d.codecs, "forward", None)) for d in sharded._output_dists}))
    return out
