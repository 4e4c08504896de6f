"""Where a new shard's values come from: a copy out of a collection built with storage (checked
alike on every rank, or broadcast from one rank), or the seeded init of a meta-built collection.

A collection built with storage holds whole tables on every rank, and each rank copies out only its
own shards. Ranks whose tables differ (seeded differently, loaded from other files) would silently
assemble a sharded table that is no rank's model, and data-parallel replicas would diverge from the
first step. So ``shard()`` compares a sha256 digest of every table across ranks and raises naming the
tables that differ, or, with ``src_rank``, first broadcasts every table from that rank (in place: the
caller's unsharded collection then matches that rank's too). Meta-built collections need neither:
their values are a pure function of (``init_seed``, table name, row).

Example:
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])])
    >>> sharded = shard(ebc, {"t0": row_wise()}, src_rank=0)   # every rank gets rank 0's tables
"""

from __future__ import annotations

import hashlib
from typing import Callable, Optional, Union

import torch
import torch.distributed as dist

from .collection.init import fill_rows
from .sharding.comm import all_gather_ints

__all__ = ["shard_source", "check_or_broadcast", "check_same_everywhere", "check_one_dtype", "table_weight"]


def table_weight(ebc, name: str) -> torch.Tensor:
    """A table's weight in an unsharded collection: ``embedding_bags`` of an EmbeddingBagCollection,
    ``embeddings`` of an EmbeddingCollection (TorchRec's attribute names)."""
    tables = getattr(ebc, "embedding_bags", None)
    return (ebc.embeddings if tables is None else tables)[name].weight


def shard_source(ebc, tables: list) -> Union[dict, Callable]:
    """``{table: whole weight}`` for a collection with storage, else ``fill(box, out)``."""
    if not ebc.is_meta:
        return {t.name: table_weight(ebc, t.name).detach() for t in tables}
    by_name = {t.name: t for t in tables}

    def fill(box, out: torch.Tensor) -> None:
        t = by_name[box.table]
        fill_rows(out, t, ebc.init_seed, box.row_offset, box.col_offset)
        if t.init_fn is not None:     # per shard, as TorchRec applies it
            t.init_fn(out)
    return fill


def _digest(t: torch.Tensor) -> list:
    h = hashlib.sha256()
    flat = t.detach().reshape(-1)
    step = 1 << 24                    # bounded temporaries for tensors off the CPU
    for s in range(0, flat.numel(), step):
        part = flat[s:s + step].contiguous().cpu()
        h.update(part.view(torch.uint8).numpy().data if part.numel() else b"")
    return list(h.digest()[:8])


def check_or_broadcast(ebc, topo, src_rank: Optional[int], where: str = "shard()") -> None:
    """Collective over the mesh's group: make sure every rank copies shards out of the same tables."""
    if ebc.is_meta:
        return
    names = [t.name for t in ebc.tables]
    if src_rank is not None:
        with torch.no_grad():
            for n in names:
                w = table_weight(ebc, n)
                buf = w.data if w.device == topo.device else w.data.to(topo.device)
                dist.broadcast(buf, dist.get_global_rank(topo.group, src_rank), group=topo.group)
                if buf is not w.data:
                    w.data.copy_(buf)
        return
    mine = [b for n in names for b in _digest(table_weight(ebc, n))]
    rows = all_gather_ints(mine, topo.world_size, topo.group, topo.device)
    differ = {}
    for k, n in enumerate(names):
        ranks = [r for r in range(topo.world_size) if rows[r][8 * k:8 * k + 8] != rows[0][8 * k:8 * k + 8]]
        if ranks:
            differ[n] = ranks
    if differ:
        which = ", ".join(f"{n!r} on ranks {r}" for n, r in differ.items())
        raise ValueError(f"{where}: the unsharded tables differ across ranks ({which} "
                         f"differ from rank 0), so the shards would mix different models; build the collection "
                         f"with the same init_seed and weights on every rank, build it on the meta device, or pass "
                         f"src_rank=0 to broadcast rank 0's tables first")


def _weight_dtypes(ebc) -> dict:
    return {t.name: str(table_weight(ebc, t.name).dtype) for t in ebc.tables}


def check_one_dtype(ebc, where: str = "shard()") -> None:
    """The stores hold one weight dtype: tables whose weights differ in dtype are refused instead of some
    being cast. The weights' own dtype (meta ones carry it too; a table cast with ``.half()`` keeps its
    config's ``data_type``). No collective."""
    kind = _weight_dtypes(ebc)
    if len(set(kind.values())) > 1:
        by_kind = {k: [n for n in kind if kind[n] == k] for k in sorted(set(kind.values()))}
        raise ValueError(f"{where}: the tables' weights have different dtypes {by_kind}; a sharded collection stores "
                         f"its weights in one dtype. Give every table the same data_type (or cast them all to one "
                         f"dtype), or shard the tables of each dtype in a collection of their own")


def check_same_everywhere(ebc, plan: dict, topo, src_rank=None, gradient_division=True, settings=None,
                          where: str = "shard()", qcomm: str = "fp32") -> None:
    """Ranks given other tables, weight dtypes or another plan would build other routing and exchange
    garbage in the first forward; one all-gather of a digest makes them all raise here instead. Then,
    alike on every rank and before anything changes, the tables must share one weight dtype."""
    mesh = topo.mesh
    text = repr([(t, plan[t.name]) for t in ebc.tables]) + repr(list(_weight_dtypes(ebc).values()))
    text += repr((ebc.is_weighted, ebc.is_meta, ebc.init_seed if ebc.is_meta else None, src_rank, gradient_division, qcomm))
    text += repr((tuple(mesh.shape), mesh.mesh.flatten().tolist(), mesh.device_type))
    # the optimizer settings decide the groups of tables, hence the collectives of every step
    text += repr(sorted((t, None if s is None else (s[0].name, sorted((k, repr(v)) for k, v in s[1].items())))
                        for t, s in (settings or {}).items()))
    digest = list(hashlib.sha256(text.encode()).digest()[:16])
    # a mesh over every rank is checked on the default group: ranks given meshes of other shapes
    # would otherwise run the check itself on different groups and wait there
    covers_all = topo.world_size == dist.get_world_size()
    group, n = (dist.group.WORLD, dist.get_world_size()) if covers_all else (topo.group, topo.world_size)
    rows = all_gather_ints(digest, n, group, topo.device)
    differ = [r for r in range(n) if rows[r] != rows[0]]
    if differ:
        raise ValueError(f"{where}: ranks {differ} were given other tables, another plan or another mesh than "
                         f"rank 0 (or other optimizers, or tables whose weights differ in dtype); every rank must call "
                         f"{where} with the same table configs, weight dtypes, plan, optimizers, mesh, init_seed, "
                         f"src_rank, qcomm codecs and device (meta or not)")
    check_one_dtype(ebc, where)
