"""Per-rank worker functions for the compile tests of guards, errors and special models (run through
run_on_ranks from test_guards_and_errors.py): re-tracing rules, the trace cap, bad steps, input
gradients and printing, tied weights, resuming from eager, buffers, warnings."""
from __future__ import annotations

import copy

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from shardwise.compile import DataParallel, compile
from shardwise.compile.graph_utils import is_collective
from shardwise.testing.harness import worker_mesh
from tests.compile.dp_cases import _max_diff
from tests.compile.models import make_case, make_optimizer


def guards(rank, world, style):
    """Scheduler lr changes without re-tracing; shape/dtype/hyper-parameter changes re-trace."""
    mesh = worker_mesh((world,))
    model, fn, batches = make_case("mlp", 8 * world)
    ref = copy.deepcopy(model)
    opt, ref_opt = make_optimizer("adam", model.parameters()), make_optimizer("adam", ref.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    step = compile(parallel_mode=DataParallel(style, mesh=mesh, input="global"))(fn)
    log = []

    def both(x, y):
        step(model, opt, x, y)
        fn(ref, ref_opt, x, y)
        sched.step()
        ref_sched.step()
        log.append((step.traces, _max_diff(list(model.parameters()), list(ref.parameters()))))

    for x, y in batches[:3]:
        both(x, y)  # lr halves every step: still one trace
    x, y = batches[3]
    both(x[: 2 * world], y[: 2 * world])  # new batch shape
    for group in (opt.param_groups[0], ref_opt.param_groups[0]):
        group["betas"] = (0.8, 0.99)
    both(*batches[4])  # new hyper-parameter
    both(*batches[0])  # back to a known shape with the new betas: cached
    return log


def dtype_guard(rank, world):
    mesh = worker_mesh((world,))
    model, fn, batches = make_case("block", 2 * world)
    opt = make_optimizer("adam", model.parameters())
    seen = []

    def transform(gm):  # gm_transformation runs once per trace, on the final graph
        seen.append(sum(1 for n in gm.graph.nodes if is_collective(n)))
        return gm

    step = compile(parallel_mode=DataParallel("replicate", mesh=mesh, input="global"), gm_transformation=transform)(fn)
    x, y = batches[0]
    step(model, opt, x, y)
    step(model, opt, x.to(torch.int32), y)
    step(model, opt, x, y)
    return step.traces, len(seen), min(seen) > 0


def trace_cap(rank, world):
    """At most max_traces traces are kept (least recently used evicted); a warning after warn_after."""
    import warnings

    mesh = worker_mesh((world,))
    model, fn, batches = make_case("mlp", 8 * world)
    ref = copy.deepcopy(model)
    opt, ref_opt = make_optimizer("sgd", model.parameters()), make_optimizer("sgd", ref.parameters())
    step = compile(parallel_mode=DataParallel("replicate", mesh=mesh, input="global"))(fn)
    step.max_traces, step.warn_after = 2, 3
    x, y = batches[0]
    # per rank x world. The first step traces without optimizer state, the second with it; 4 evicts
    # that first trace; 8 is cached; 2 evicts 4; 4 is traced again
    sizes = [8, 8, 4, 8, 2, 4]
    traces = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in sizes:
            step(model, opt, x[: n * world], y[: n * world])
            fn(ref, ref_opt, x[: n * world], y[: n * world])
            traces.append(step.traces)
    msgs = [str(w.message) for w in caught if "has traced" in str(w.message)]
    return traces, len(step._cache), msgs, _max_diff(list(model.parameters()), list(ref.parameters()))


def _bad_step_no_backward(model, optimizer, x, y):
    model(x).sum()
    optimizer.step()


def errors(rank, world):
    """Each bad call's (exception type, message); the model must stay untouched."""
    mesh = worker_mesh((world,))
    model, fn, batches = make_case("mlp", 2 * world)
    x, y = batches[0]
    mode = DataParallel("fully_shard", mesh=mesh, input="global")
    opt = make_optimizer("adam", model.parameters())
    calls = {
        "no_module": lambda: compile(parallel_mode=mode)(fn)(None, opt, x, y),
        "no_optimizer": lambda: compile(parallel_mode=mode)(fn)(model, None, x, y),
        "indivisible_batch": lambda: compile(parallel_mode=mode)(fn)(model, opt, x[:2 * world - 1], y[:2 * world - 1]),
        "unsupported_optimizer": lambda: compile(parallel_mode=mode)(fn)(
            model, torch.optim.RMSprop(model.parameters()), x, y),
        "amsgrad": lambda: compile(parallel_mode=mode)(fn)(
            model, torch.optim.Adam(model.parameters(), amsgrad=True), x, y),
        "no_backward": lambda: compile(parallel_mode=mode)(_bad_step_no_backward)(model, opt, x, y),
        "bad_style": lambda: DataParallel(mesh, style="zero3"),
        "bad_input": lambda: DataParallel("replicate", input="sliced"),
        "two_styles": lambda: DataParallel("replicate", parallel_style="fully_shard"),
        "style_twice": lambda: DataParallel("replicate", style="replicate"),
        "mesh_twice": lambda: DataParallel(mesh, mesh=mesh),
        "too_many_positional": lambda: DataParallel("replicate", 0),
        "batch_dim_none": lambda: DataParallel("replicate", input_batch_dim=None),
        "two_d_mesh": lambda: DataParallel("replicate", mesh=worker_mesh((1, world))),
        "local_missing_batch_dim": lambda: compile(parallel_mode=DataParallel("replicate"))(fn)(
            model, opt, x[0, 0], y),
        "local_ranks_differ": lambda: compile(parallel_mode=DataParallel("replicate"))(fn)(
            model, opt, x[: 2 + rank], y[: 2 + rank]),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except (TypeError, ValueError) as exc:
            out[name] = (type(exc).__name__, str(exc))
    out["untouched"] = all(type(p.data) is torch.Tensor for p in model.parameters()) and not opt.state
    return out


def _step_with_input_grad(model, optimizer, x, y):
    x = x.detach().requires_grad_(True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    (gx,) = torch.autograd.grad(loss, [x], retain_graph=True)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach(), gx


def input_grad_and_printing(rank, world, style):
    """A step that also takes an input gradient; the graph prints with collective counts."""
    from shardwise.compile import format_graph

    mesh = worker_mesh((world,))
    model, _, batches = make_case("mlp", 4 * world)
    ref = copy.deepcopy(model)
    opt, ref_opt = make_optimizer("sgd", model.parameters()), make_optimizer("sgd", ref.parameters())
    step = compile(parallel_mode=DataParallel(style, mesh=mesh, input="global"))(_step_with_input_grad)
    out = []
    for x, y in batches[:2]:
        loss, gx = step(model, opt, x, y)
        xl, yl = x.chunk(world)[rank], y.chunk(world)[rank]
        ref_loss, ref_gx = _step_with_input_grad(ref, ref_opt, xl, yl)  # eager on this rank's slice
        out.append(((gx - ref_gx).abs().max().item(), abs(loss.item() - ref_loss.item())))
    return {"diffs": out, "text": format_graph(step.graph)}


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 11, bias=False)
        self.out.weight = self.emb.weight  # tied input/output embedding

    def forward(self, tokens):
        return self.out(torch.tanh(self.mid(self.emb(tokens))))


def tied_weights(rank, world, style):
    """A tied embedding/head trains like one process (one parameter, two uses)."""
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    model = _Tied()
    ref = copy.deepcopy(model)
    opt, ref_opt = make_optimizer("adam", model.parameters()), make_optimizer("adam", ref.parameters())
    from tests.compile.models import block_step

    step = compile(parallel_mode=DataParallel(style, mesh=mesh, input="global"))(block_step)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x, y = torch.randint(0, 11, (4 * world, 5), generator=g), torch.randint(0, 11, (4 * world, 5), generator=g)
        step(model, opt, x, y)
        block_step(ref, ref_opt, x, y)
    return {"diff": _max_diff(list(model.parameters()), list(ref.parameters())),
            "tied": model.out.weight is model.emb.weight}


def resume_from_eager(rank, world, style, opt_name):
    """Two eager steps (torch.optim state exists), then compiled steps: same as all eager."""
    mesh = worker_mesh((world,))
    model, fn, batches = make_case("mlp", 4 * world)
    ref = copy.deepcopy(model)
    opt, ref_opt = make_optimizer(opt_name, model.parameters()), make_optimizer(opt_name, ref.parameters())
    for x, y in batches[:2]:
        fn(model, opt, x, y)
        fn(ref, ref_opt, x, y)
    step = compile(parallel_mode=DataParallel(style, mesh=mesh, input="global"))(fn)
    for x, y in batches[2:]:
        step(model, opt, x, y)
        fn(ref, ref_opt, x, y)
    return {"diff": _max_diff(list(model.parameters()), list(ref.parameters())), "traces": step.traces}


def with_buffers(rank, world, style):
    """BatchNorm buffers stay whole per rank; parameters and local running stats match DDP."""
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ddp = DDP(copy.deepcopy(model), process_group=mesh.get_group(), broadcast_buffers=False)
    opt, ddp_opt = make_optimizer("sgd", model.parameters()), make_optimizer("sgd", ddp.parameters())
    from tests.compile.models import mlp_step

    step = compile(parallel_mode=DataParallel(style, mesh=mesh, input="global"))(mlp_step)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        x, y = torch.randn(4 * world, 6, generator=g), torch.randn(4 * world, 3, generator=g)
        step(model, opt, x, y)
        mlp_step(ddp, ddp_opt, x.chunk(world)[rank], y.chunk(world)[rank])
    bufs = dict(model.named_buffers())
    return {
        "params": _max_diff(list(model.parameters()), list(ddp.module.parameters())),
        "buffers": max((bufs[n].float() - b.float()).abs().max().item() for n, b in ddp.module.named_buffers()),
        "plain_full": all(type(b) is torch.Tensor and b.shape == ddp.module.get_buffer(n).shape
                          for n, b in bufs.items()),
    }


def warnings_of_a_run(rank, world, style):
    """Every warning raised while a compiled step traces and replays (deprecated torch calls included)."""
    import warnings

    mesh = worker_mesh((world,))
    model, fn, batches = make_case("mlp", 4 * world)
    opt = make_optimizer("adam", model.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # also the ones an earlier test in this worker already showed
        step = compile(parallel_mode=DataParallel(style))(fn)  # the default mesh is built here, too
        for x, y in batches[:2]:
            step(model, opt, x.chunk(world)[rank], y.chunk(world)[rank])
    return [(w.category.__name__, str(w.message), w.filename) for w in caught]
