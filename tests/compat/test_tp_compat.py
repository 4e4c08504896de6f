"""shardwise.parallel used the way PyTorch tensor-parallel code uses torch.distributed.tensor.parallel.

A sequence-parallel block (SequenceParallel -> ColwiseParallel -> RowwiseParallel, torchtitan's plan),
a batch-sharded MLP wrapped in PrepareModuleInputOutput, and a model built on the meta device,
parallelized, then materialized with ``to_empty`` and initialised. Each is checked against the same
module run unsharded in plain PyTorch: outputs, input gradients and parameter gradients, plus the
collectives each forward issues.
"""

import copy

import torch
from torch import nn

from shardwise.parallel import (
    ColwiseParallel, PrepareModuleInputOutput, RowwiseParallel, SequenceParallel, parallelize_module,
)
from shardwise.tensor import CollectiveCounter, DTensor, Replicate, Shard, distribute_tensor
from shardwise.testing import run_on_ranks, worker_mesh


class Block(nn.Module):
    def __init__(self, dim=8, hidden=12):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, dim=8, hidden=12):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


SEQUENCE_PLAN = {
    "norm": SequenceParallel(),                         # sequence-sharded in, sequence-sharded DTensor out
    "up": ColwiseParallel(input_layouts=Shard(1)),      # all-gather the sequence, shard the features
    "down": RowwiseParallel(output_layouts=Shard(1)),   # reduce-scatter back to the sequence
}


def _init_weights(model, seed=3):
    """A user's deterministic init: the same global values for eager and DTensor parameters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            full = torch.randn(p.shape, generator=gen)
            if isinstance(p, DTensor):
                full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
            p.copy_(full)


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _compare(model, ref, x_full, dim, rank, world):
    """Run ``model`` on this rank's piece of ``x_full`` along ``dim`` and ``ref`` on all of it; compare
    the output piece, the input gradient piece and every parameter gradient. Returns the forward's
    collective counts."""
    gen = torch.Generator().manual_seed(7)
    grad_full = torch.randn(ref(x_full).shape, generator=gen)
    x_ref = x_full.clone().requires_grad_()
    out_ref = ref(x_ref)
    out_ref.backward(grad_full)
    x = x_full.chunk(world, dim)[rank].clone().requires_grad_()
    with CollectiveCounter() as c:
        out = model(x)
    assert not isinstance(out, DTensor), "use_local_output=True gives plain tensors"
    torch.testing.assert_close(out, out_ref.chunk(world, dim)[rank])
    out.backward(grad_full.chunk(world, dim)[rank])
    torch.testing.assert_close(x.grad, x_ref.grad.chunk(world, dim)[rank])
    grads = {n: _full(p.grad) for n, p in model.named_parameters()}
    torch.testing.assert_close(grads, {n: p.grad for n, p in ref.named_parameters()})
    return c.counts


def _sequence_block(rank, world):
    mesh = worker_mesh((world,))
    torch.manual_seed(0)  # the same block on every rank (SequenceParallel replicates without a broadcast)
    ref = Block()
    _init_weights(ref)
    model = parallelize_module(copy.deepcopy(ref), mesh, SEQUENCE_PLAN)
    counts = _compare(model, ref, torch.randn(2, 2 * world, 8, generator=torch.Generator().manual_seed(1)),
                      1, rank, world)
    placements = {n: p.placements for n, p in model.named_parameters()}
    return counts, placements


def test_sequence_parallel_block_matches_plain_pytorch():
    counts, placements = run_on_ranks(_sequence_block, 2)[0]
    # one all-gather into the column-wise Linear, one reduce-scatter out of the row-wise one
    assert counts == {"all_gather": 1, "reduce_scatter": 1}
    assert placements == {"norm.weight": (Replicate(),), "norm.bias": (Replicate(),),
                          "up.weight": (Shard(0),), "up.bias": (Shard(0),),
                          "down.weight": (Shard(1),), "down.bias": (Replicate(),)}


def _batch_sharded_mlp(rank, world):
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    ref = MLP()
    plan = {
        "": PrepareModuleInputOutput(input_layouts=Shard(0), desired_input_layouts=Replicate(),
                                     output_layouts=Replicate(), desired_output_layouts=Shard(0)),
        "up": ColwiseParallel(), "down": RowwiseParallel(),
    }
    model = parallelize_module(copy.deepcopy(ref), mesh, plan)
    return _compare(model, ref, torch.randn(2 * world, 3, 8, generator=torch.Generator().manual_seed(2)),
                    0, rank, world)


def test_prepare_module_input_output_batch_sharded_mlp():
    # the batch is gathered in, the row-wise output all-reduced, and the replicated result sliced
    # back to the batch piece without communication
    assert run_on_ranks(_batch_sharded_mlp, 2) == [{"all_gather": 1, "all_reduce": 1}] * 2


def _meta_model(rank, world):
    mesh = worker_mesh((world,))
    with torch.device("meta"):
        model = Block()
    parallelize_module(model, mesh, SEQUENCE_PLAN)
    meta = {n: (p.device.type, tuple(p.to_local().shape)) for n, p in model.named_parameters()}
    model.to_empty(device="cpu")
    _init_weights(model)
    ref = Block()
    _init_weights(ref)
    counts = _compare(model, ref, torch.randn(2, 2 * world, 8, generator=torch.Generator().manual_seed(1)),
                      1, rank, world)
    return meta, counts


def test_meta_device_model_parallelized_then_initialised():
    for rank, (meta, counts) in enumerate(run_on_ranks(_meta_model, 2)):
        assert meta == {"norm.weight": ("meta", (8,)), "norm.bias": ("meta", (8,)),
                        "up.weight": ("meta", (6, 8)), "up.bias": ("meta", (6,)),
                        "down.weight": ("meta", (8, 6)), "down.bias": ("meta", (8,))}
        assert counts == {"all_gather": 1, "reduce_scatter": 1}


def _meta_on_one_rank(rank, world):
    mesh = worker_mesh((world,))  # every rank: building a mesh is a collective
    if rank != 0:
        return None
    with torch.device("meta"):  # only rank 0 parallelizes: a collective would never complete
        model = parallelize_module(Block(), mesh, SEQUENCE_PLAN)
    return {n: type(p).__name__ for n, p in model.named_parameters()}


def test_meta_model_is_parallelized_without_communication():
    out = run_on_ranks(_meta_on_one_rank, 2, timeout=30)
    assert out[1] is None and set(out[0].values()) == {"DTensor"} and len(out[0]) == 6
