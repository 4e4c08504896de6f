"""distribute_module (torch's signature and semantics) against the same module in plain PyTorch."""

import warnings

import torch
from torch import nn

from shardwise.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from shardwise.testing import run_on_ranks, worker_mesh


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.proj = nn.Linear(6, 3)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, ids):
        return self.proj(self.emb(ids)) * self.scale


def _shard_emb_rows(name, mod, mesh):
    if name == "emb":
        for n, p in list(mod.named_parameters(recurse=False)):
            mod.register_parameter(n, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))


def _replicated_ids(mod, inputs, mesh):
    return (DTensor.from_local(inputs[0], mesh, [Replicate()]),)


def _gathered(mod, output, mesh):
    return output.full_tensor()


def _partition_and_hooks(rank, world):
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    ref = Tagger()
    model = Tagger()
    model.load_state_dict(ref.state_dict())
    if rank == 1:  # distribute_module's replication broadcasts rank 0's values
        with torch.no_grad():
            model.proj.weight.add_(1.0)
    distribute_module(model, mesh, _shard_emb_rows, _replicated_ids, _gathered)
    ids = torch.tensor([[1, 9, 4], [0, 4, 7]])
    out = model(ids)
    out_ref = ref(ids)
    torch.testing.assert_close(out, out_ref)
    out.pow(2).sum().backward()
    out_ref.pow(2).sum().backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    torch.testing.assert_close(grads, {n: p.grad for n, p in ref.named_parameters()})
    layout = {n: p.placements for n, p in model.named_parameters()}
    return layout, type(model.scale).__name__, model.scale.placements


def test_partition_fn_then_everything_else_replicated_and_hooks():
    layout, buf_type, buf_layout = run_on_ranks(_partition_and_hooks, 2)[0]
    assert layout == {"emb.weight": (Shard(0),), "proj.weight": (Replicate(),), "proj.bias": (Replicate(),)}
    assert buf_type == "DTensor" and buf_layout == (Replicate(),)


def _defaults_and_meta(rank, world):
    mesh = worker_mesh((world,))
    out = {}
    with mesh:  # device_mesh=None: the mesh of the `with` block, as torch's
        model = distribute_module(Tagger())
    out["all_replicated"] = {p.placements for p in model.parameters()} == {(Replicate(),)}
    if rank == 0:  # meta tensors are laid out with no collective: rank 0 alone would block on one
        with torch.device("meta"):
            meta = Tagger()
        distribute_module(meta, mesh, _shard_emb_rows)
        out["meta_local"] = tuple(meta.emb.weight.to_local().shape), meta.emb.weight.device.type
        out["meta_replicated"] = meta.proj.weight.placements, meta.scale.device.type
        meta.to_empty(device="cpu")
        out["materialized"] = meta.emb.weight.to_local().device.type, tuple(meta.emb.weight.shape)
    # the meta layout by hand: uneven rows, requires_grad kept, from_local of a meta piece
    w = distribute_tensor(torch.empty(5, 3, device="meta", requires_grad=True), mesh, [Shard(0)])
    piece = DTensor.from_local(torch.empty(2, 3, device="meta"), mesh, [Shard(1)])
    out["by_hand"] = tuple(w.to_local().shape), w.requires_grad, tuple(piece.shape), piece.device.type
    return out


def test_default_mesh_replication_and_meta_modules():
    outs = run_on_ranks(_defaults_and_meta, 2, timeout=60)
    assert all(o["all_replicated"] for o in outs)
    assert outs[0]["meta_local"] == ((5, 6), "meta") and outs[0]["materialized"] == ("cpu", (10, 6))
    assert outs[0]["meta_replicated"] == ((Replicate(),), "meta")
    assert [o["by_hand"] for o in outs] == [((3, 3), True, (2, 6), "meta"), ((2, 3), True, (2, 6), "meta")]


def _four_args(mod, inputs, mesh, extra):
    return inputs


def _old_style_output(output, mesh):  # torch's deprecated (outputs, device_mesh) form
    return output.full_tensor()


def _errors(rank, world):
    mesh = worker_mesh((world,))
    out = {}
    model = Tagger()
    try:
        distribute_module(model, mesh, input_fn=_four_args)
    except ValueError as e:
        out["arity"] = str(e)
    out["untouched"] = not any(isinstance(p, DTensor) for p in model.parameters())
    try:
        distribute_module(model, mesh, partition_fn="rows")
    except TypeError as e:
        out["not_callable"] = str(e)
    try:
        distribute_module(model)
    except ValueError as e:
        out["no_mesh"] = str(e)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distribute_module(model, mesh, input_fn=_replicated_ids, output_fn=_old_style_output)
    out["warned"] = [w.category.__name__ for w in caught]
    out["old_style_works"] = type(model(torch.tensor([1, 2]))).__name__
    try:
        distribute_module(model, mesh)
    except RuntimeError as e:
        out["twice"] = str(e)
    return out


def test_errors_raise_before_changes_and_torch_deprecations():
    out = run_on_ranks(_errors, 2)[0]
    assert "input_fn takes 4 arguments; it must take 3 (module, inputs, device_mesh)" in out["arity"]
    assert out["untouched"], "the module changed before the error"
    assert "partition_fn='rows'" in out["not_callable"]
    assert "no `with mesh:` block is active" in out["no_mesh"]
    assert out["warned"] == ["FutureWarning"] and out["old_style_works"] == "Tensor"
    assert "distributed already" in out["twice"]
