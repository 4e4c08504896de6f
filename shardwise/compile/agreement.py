"""Cross-rank agreement of a compiled data-parallel step, carried by the step's own collectives.

Every rank must step with the same batch shapes, learning rates and optimizer settings, or the
replicas silently diverge (and an average of gradients over unequal local batches is not the gradient
of the whole batch).  Each call hashes this rank's description (crc32, not Python's per-process hash)
into 32 bits; the graph appends them, as 0/1 values, to its first gradient bucket (see
``passes/agreement_carrier.py``), so the check costs no collective of its own.  After that bucket's
all-reduce (or reduce-scatter) every bit sums to 0 or to the world size on every rank exactly when
all ranks agree; otherwise every rank sees the same sums, :func:`check_sums` raises
:class:`RanksDisagree` before the optimizer writes anything, and :func:`explain` gathers the
descriptions (only then) so every rank raises the same ``ValueError`` naming the difference.

A rank that cannot even build its step (a batch that fails to trace on that rank only) must not leave
the others waiting in the step's collectives: it replays the collectives of the graph it ran last
(:func:`replay_collectives`, zeros with a poisoned carrier, identical shapes and order on every rank),
so the others' check fails too and all ranks meet in :func:`explain`.

Example::

    mine = describe(batch, optimizer, spec)
    bits = digest_bits(mine, device)      # a graph input; the graph checks the sums
"""
from __future__ import annotations

import zlib

import torch
import torch.utils._pytree as pytree

__all__ = ["RanksDisagree", "describe", "digest_bits", "check_sums", "explain", "check_now",
           "replay_collectives", "DIGEST_BITS"]

DIGEST_BITS = 32
_FIELDS = ("batch", "lr", "optimizer", "error")


class RanksDisagree(Exception):
    """Raised inside the graph on every rank at once; turned into a ``ValueError`` by :func:`explain`."""


def describe(batch, optimizer, spec, error: str | None = None) -> dict:
    """What all ranks must agree on, as strings (plus this rank's build error, if any)."""
    leaves = pytree.tree_leaves(batch)
    desc = [(tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(x) for x in leaves]
    return {"batch": repr(desc), "lr": repr([g["lr"] for g in optimizer.param_groups]),
            "optimizer": repr(spec), "error": error}


def digest_bits(mine: dict, device) -> torch.Tensor:
    digest = zlib.crc32("|".join(str(mine[k]) for k in _FIELDS).encode())
    return torch.tensor([(digest >> i) & 1 for i in range(DIGEST_BITS)], dtype=torch.float32, device=device)


def check_sums(sums: torch.Tensor, world: int) -> None:
    """Graph op: each bit's sum over ranks is 0 or ``world`` iff every rank sent the same bits.

    Sums are small integers, exact in float32/float64 (the carrier pass only uses those dtypes)."""
    if not bool(((sums == 0) | (sums == world)).all()):
        raise RanksDisagree()


def explain(group, mine: dict) -> None:
    """Collective: gather every rank's description and raise the same ``ValueError`` on every rank."""
    import torch.distributed as dist

    details = [None] * dist.get_world_size(group)
    dist.all_gather_object(details, mine, group=group)
    failed = [(r, d["error"]) for r, d in enumerate(details) if d["error"] is not None]
    msgs = []
    for what in _FIELDS[:-1]:
        values = [d[what] for d in details]
        if len(set(values)) > 1:
            diffs = "; ".join(f"rank {r}: {v}" for r, v in enumerate(values) if v != values[0])
            msgs.append(f"ranks disagree on the {what} (rank 0: {values[0]}; {diffs})")
    if failed and len(failed) < len(details):
        msgs.append("only some ranks could not build the step (" + "; ".join(f"rank {r}: {e}" for r, e in failed) + ")")
    if msgs:
        raise ValueError(
            "compiled step: " + "; ".join(msgs) + "; data parallel needs the same batch shapes and optimizer "
            "settings on every rank (drop or pad a ragged last batch)"
        )


def check_now(mesh, mine: dict) -> None:
    """The explicit check (one 32-float all-reduce): the first call, and modes whose graphs carry nothing."""
    import torch.distributed as dist

    from shardwise._device import mesh_device

    group = mesh.get_group()
    sums = digest_bits(mine, mesh_device(mesh))
    dist.all_reduce(sums, group=group)
    try:
        check_sums(sums, dist.get_world_size(group))
    except RanksDisagree:
        explain(group, mine)
        raise AssertionError("the digests differed but the descriptions agree (crc32 of equal strings)")


@torch.no_grad()
def replay_collectives(gm: torch.fx.GraphModule, device) -> None:
    """Run ``gm``'s collectives in graph order on zeros, the agreement carrier poisoned (0.5 is no
    0/1 bit: the sums stop being 0 or the world size on every rank)."""
    from .graph_utils import C10D, is_collective

    for node in gm.graph.nodes:
        if not is_collective(node):
            continue
        val = node.args[0].meta["val"]
        fill = 0.5 if node.meta.get("sw_agree_carrier") else 0.0
        data = torch.full(val.shape, fill, dtype=val.dtype, device=device)
        C10D.wait_tensor.default(node.target(data, *node.args[1:]))


def mutated_buffers(gm: torch.fx.GraphModule) -> list[str]:
    """Buffers the graph may write in place, restored if the check fails: arguments the op's schema marks
    written, and every buffer a batch-norm op reads (``native_batch_norm`` updates its running statistics
    although its schema does not say so)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        batch_norm = "batch_norm" in node.target.name()
        for i, arg in enumerate(node.target._schema.arguments):
            if not batch_norm and (arg.alias_info is None or not arg.alias_info.is_write):
                continue
            v = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(v, torch.fx.Node) and v.op == "placeholder" and v.meta.get("sw_kind") == "buffer":
                out.append(v.meta["sw_fqn"])
    return sorted(set(out))
