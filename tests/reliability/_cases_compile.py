"""Bad inputs for ``shardwise.compile`` data parallelism, built on every rank (see ``_runner.run_case``).

Most cases first run one good compiled step, so the model holds DTensors and Adam state that a
half-applied bad call could corrupt.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardwise.compile import DataParallel, compile
from shardwise.testing import worker_mesh

from ._runner import short_timeout_mesh


def _step(model, optimizer, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def _no_backward_step(model, optimizer, x, y):
    optimizer.step()
    return F.mse_loss(model(x), y)


def _setup(world, mesh=None, style="replicate", trained=True, input="local"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = compile(parallel_mode=DataParallel(style, mesh=mesh or worker_mesh((world,)), input=input))(_step)
    if trained:
        step(model, opt, *_batch(4 * world))
    return model, opt, step


def _batch(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)


def bad_style(rank, world):
    return lambda: DataParallel(worker_mesh((world,)), style="zero3"), []


def two_d_mesh(rank, world):
    return lambda: DataParallel(worker_mesh((1, world))), []


def negative_batch_dim(rank, world):
    return lambda: DataParallel(worker_mesh((world,)), input_batch_dim=-1), []


def mode_not_a_parallel_mode(rank, world):
    return lambda: compile(parallel_mode="ddp"), []


def first_arg_not_a_module(rank, world):
    model, opt, step = _setup(world)
    return lambda: step(opt, model, *_batch(4)), [model, opt]


def unsupported_optimizer(rank, world):
    model, _, _ = _setup(world, trained=False)
    step = compile(parallel_mode=DataParallel(worker_mesh((world,))))(_step)
    opt = torch.optim.RMSprop(model.parameters())
    return lambda: step(model, opt, *_batch(4)), [model, opt]


def amsgrad_optimizer(rank, world):
    model, _, _ = _setup(world, trained=False)
    step = compile(parallel_mode=DataParallel(worker_mesh((world,))))(_step)
    opt = torch.optim.Adam(model.parameters(), amsgrad=True)
    return lambda: step(model, opt, *_batch(4)), [model, opt]


def batch_not_divisible(rank, world):
    # only a global batch is split over the ranks
    model, opt, step = _setup(world, input="global")
    return lambda: step(model, opt, *_batch(2 * world + 1)), [model, opt]


def batch_missing_dim(rank, world):
    model, opt, step = _setup(world)
    x, y = _batch(4)
    return lambda: step(model, opt, x[0, 0], y), [model, opt]


def no_backward_in_step(rank, world):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = compile(parallel_mode=DataParallel(worker_mesh((world,))))(_no_backward_step)
    return lambda: step(model, opt, *_batch(4)), [model, opt]


def other_model_after_bind(rank, world):
    model, opt, step = _setup(world)
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    other_opt = torch.optim.Adam(other.parameters(), lr=0.01)
    return lambda: step(other, other_opt, *_batch(4)), [model, opt, other, other_opt]


def lr_tensor(rank, world):
    model, opt, step = _setup(world)

    def call():
        opt.param_groups[0]["lr"] = torch.tensor(0.1)
        try:
            step(model, opt, *_batch(4))
        finally:
            opt.param_groups[0]["lr"] = 0.01
    return call, [model, opt]


def batch_size_differs_one_rank(rank, world):
    # each rank passes its own batch, but all of the same shape; one rank handing in another size
    model, opt, step = _setup(world, mesh=short_timeout_mesh())
    n = 6 * world if rank == world - 1 else 4 * world
    return lambda: step(model, opt, *_batch(n)), [model, opt]


def lr_differs_one_rank(rank, world):
    # a per-rank learning rate silently desynchronises the replicas
    model, opt, step = _setup(world, mesh=short_timeout_mesh())

    def call():
        opt.param_groups[0]["lr"] = 0.5 if rank == world - 1 else 0.01
        try:
            step(model, opt, *_batch(4 * world))
        finally:   # put the lr back so the digest compares the optimizer's state, not our edit
            opt.param_groups[0]["lr"] = 0.01
    return call, [model, opt]


def batch_size_differs_one_rank_fully_shard(rank, world):
    # the check rides in a reduce-scatter bucket here (every rank's chunk carries the bits)
    model, opt, step = _setup(world, mesh=short_timeout_mesh(), style="fully_shard")
    n = 6 * world if rank == world - 1 else 4 * world
    return lambda: step(model, opt, *_batch(n)), [model, opt]


def width_differs_one_rank(rank, world):
    # the last rank's batch fails to trace there while the others run their step: it replays the last
    # step's collectives so nobody waits for it, and every rank raises the same error
    model, opt, step = _setup(world, mesh=short_timeout_mesh())
    x, y = _batch(4 * world)
    if rank == world - 1:
        x = torch.cat([x, x[:, :1]], dim=1)
    return lambda: step(model, opt, x, y), [model, opt]


def batchnorm_batch_differs_one_rank(rank, world):
    # the forward updates BatchNorm's running statistics before the check can fail: they are put back
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = compile(parallel_mode=DataParallel(mesh=short_timeout_mesh()))(_step)
    step(model, opt, *_batch(4 * world))
    n = 6 * world if rank == world - 1 else 4 * world
    return lambda: step(model, opt, *_batch(n, seed=2)), [model, opt]
