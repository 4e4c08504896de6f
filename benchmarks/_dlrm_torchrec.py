"""benchmarks/dlrm.py's TorchRec side (TorchRec 1.8 training the job's DLRM) and the torch-only helpers
both sides share. Imports nothing from shardwise: the TorchRec interpreter runs it.

Example (what ``dlrm.py --impl torchrec`` runs on every rank)::

    out = spawn(run_torchrec, 2, args, blob_path, tmp)   # {"ms": {"plain": .., "pipelined": ..}, ...}
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from _launch import rss_per_rank

__all__ = ["timed", "mean_loss", "local_bytes", "run_torchrec", "DLRMDense"]


def timed(fns: dict, blocks: int, inner: int, warmup: int, per_block: Optional[dict] = None) -> dict:
    """ms per step of each fn: ``blocks`` rounds of ``inner`` steps, rotating order, slowest rank (the
    median over blocks; ``per_block``, where given, receives every block's time per fn)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names, out = list(fns), {k: [] for k in fns}
    for b in range(blocks):
        for k in names[b % len(names):] + names[:b % len(names)]:
            dist.barrier()
            t0 = time.perf_counter()
            block = getattr(fns[k], "block", None)   # a loop that runs its steps itself
            if block is not None:
                block(inner)
            else:
                for _ in range(inner):
                    fns[k]()
            t = torch.tensor([(time.perf_counter() - t0) / inner * 1e3])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[k].append(float(t))
    if per_block is not None:
        per_block.update(out)
    return {k: statistics.median(v) for k, v in out.items()}


def mean_loss(loss: torch.Tensor) -> float:
    t = loss.detach().reshape(1).double()
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def local_bytes(obj) -> int:
    """Bytes of this rank's part of every tensor in ``obj`` (dicts, lists and tuples walked; a sharded
    tensor -- TorchRec's ShardedTensor, shardwise's ShardedTable, a DTensor -- counts its local shards)."""
    if isinstance(obj, dict):
        return sum(local_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(local_bytes(v) for v in obj)
    if hasattr(obj, "local_shards"):
        return sum(local_bytes(getattr(s, "tensor", None) if hasattr(s, "tensor") else s[1])
                   for s in obj.local_shards())
    if hasattr(obj, "to_local"):
        return local_bytes(obj.to_local())
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    return 0


# ---- TorchRec -------------------------------------------------------------------------------------
class DLRMDense(nn.Module):
    """shardwise.train.model.DLRMDense built from TorchRec's own DLRM parts (the same parameter names,
    initialisation order and math)."""

    def __init__(self, num_sparse: int, dim: int):
        from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch

        super().__init__()
        self.num_sparse, self.dim = num_sparse, dim
        n = num_sparse + 1
        self.dense_arch = DenseArch(13, [64, dim])
        self.inter_arch = InteractionArch(num_sparse)
        self.over_arch = OverArch(dim + n * (n - 1) // 2, [64, 32, 1])

    def forward(self, dense, pooled):
        x = self.dense_arch(dense)
        return self.over_arch(self.inter_arch(x, pooled.reshape(dense.shape[0], self.num_sparse, self.dim))).squeeze(1)


class TorchRecDLRM(nn.Module):
    """forward(batch) -> (loss, (loss, logits)): the shape TorchRec's train pipelines expect."""

    def __init__(self, ebc, dense: DLRMDense, keys: list):
        super().__init__()
        self.ebc, self.dense, self.keys = ebc, dense, keys

    def forward(self, batch):
        # a sharded collection's output is grouped by sharding type, not in feature order: put the
        # features back in order the way TorchRec's own DLRM (SparseArch) does
        by_key = self.ebc(batch.sparse_features).to_dict()
        pooled = torch.cat([by_key[k] for k in self.keys], dim=1)
        logits = self.dense(batch.dense_features, pooled)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach())


def _torchrec_plan(model, world: int):
    """All tables table-wise, round-robin over the ranks (the shardwise table_wise variant's layout)."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan

    names = [c.name for c in model.ebc.embedding_bag_configs()]
    mod = construct_module_sharding_plan(model.ebc, {n: table_wise(rank=i % world) for i, n in enumerate(names)},
                                         local_size=world, world_size=world, device_type="cpu")
    return ShardingPlan({"ebc": mod})


def _torchrec_model(blob: dict, plan_kind: str):
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    cfgs = [torchrec.EmbeddingBagConfig(name=name, embedding_dim=blob["dim"], num_embeddings=c, feature_names=[k])
            for (name, c, k) in zip(blob["tables"], blob["cards"], blob["keys"])]
    ebc = torchrec.EmbeddingBagCollection(tables=cfgs, device=torch.device("meta"))
    # eps: torch.optim.Adagrad's default, which the shardwise job uses (fbgemm's own is 1e-8)
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": blob["lr_sparse"], "eps": 1e-10})
    dense = DLRMDense(len(cfgs), blob["dim"])
    dense.load_state_dict(blob["dense"])
    model = TorchRecDLRM(ebc, dense, blob["keys"])
    plan = _torchrec_plan(model, dist.get_world_size()) if plan_kind == "table_wise" else None
    model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
    _load_tables(model, blob["tables"])
    opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                lambda ps: torch.optim.Adam(ps, lr=blob["lr_dense"]))
    return model, opt


@torch.no_grad()
def _load_tables(model, tables: dict) -> None:
    """Copy the shared initial tables into this rank's shards (views of the fused weights)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    for key, t in model.state_dict().items():
        name = key.split(".")[-2]
        if name not in tables:
            continue
        if not isinstance(t, ShardedTensor):   # a data-parallel table: the whole table on every rank
            t.copy_(tables[name])
            continue
        for s in t.local_shards():
            (r0, c0), (nr, nc) = s.metadata.shard_offsets, s.metadata.shard_sizes
            s.tensor.copy_(tables[name][r0:r0 + nr, c0:c0 + nc])


def run_torchrec(rank, world, args, blob_path, tmp):
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    blob = torch.load(blob_path, weights_only=False, mmap=True)   # the other ranks' batches stay on disk
    batches = [Batch(d, KeyedJaggedTensor(keys=blob["keys"], values=v, lengths=n), y)
               for d, v, n, y in blob["batches"][rank]]
    plain_model, plain_opt = _torchrec_model(blob, args.torchrec_plan)
    piped_model, piped_opt = _torchrec_model(blob, args.torchrec_plan)
    pipeline = TrainPipelineSparseDist(piped_model, piped_opt, torch.device("cpu"))
    plain_it, piped_it = itertools.cycle(batches), itertools.cycle(batches)

    def plain():
        plain_opt.zero_grad()
        loss, out = plain_model(next(plain_it))
        loss.backward()
        plain_opt.step()
        return out

    def piped():
        return pipeline.progress(piped_it)

    losses = {"plain": [mean_loss(plain()[0]) for _ in range(args.check_steps)],
              "pipelined": [mean_loss(piped()[0]) for _ in range(args.check_steps)]}
    ms = timed({"plain": plain, "pipelined": piped}, args.blocks, args.inner, args.warmup)
    plan = {}
    for mod_plan in plain_model.plan.plan.values():
        for ps in mod_plan.values():
            plan[ps.sharding_type] = plan.get(ps.sharding_type, 0) + 1
    # what this rank must hold: both models' table shards with their Adagrad state, the dense
    # parts with Adam's state, and the batches
    held = sum(local_bytes(m.state_dict()) + local_bytes(m.fused_optimizer.state_dict()["state"])
               for m in (plain_model, piped_model))
    held += sum(local_bytes(o.state_dict()["state"]) for o in (plain_opt, piped_opt))
    held += local_bytes(blob["batches"][rank])
    return {"ms": ms, "losses": losses, "plans": {"torchrec": plan}, "rss": rss_per_rank(held)}
