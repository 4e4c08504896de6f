"""ShardedEmbeddingBagCollection and shard(): model-parallel embedding bags over a process group."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..sparse import KeyedJaggedTensor, KeyedTensor
from .collection.bag_collection import EmbeddingBagCollection, check_features
from .collection.variable_batch import split_variable_batch
from .optim.fused import FusedOptimizer
from .optim.row_update import store_compiles
from .optim.rules import STATE_DTYPE
from .optim.settings import describe, table_optimizers
from .plan.values import ShardBox, ShardingType
from .reshard.load import LookupCounter
from .sharding.routing import GroupSpec, Routing
from .sharding.store import ShardStore
from .sharding.exchange import PendingInput, start_groups
from .sharding.local import LocalLookup, finish_local, local_lookup, start_local
from .sharding import SHARDERS, Stages
from .shard_source import shard_source, table_weight
from .state_dict import copy_into_shards, wrap_shards
from .batch_checks import batch_problem, raise_everywhere
from .topology import MeshTopology
from .torchrec_api.sharded_api import TorchRecShardedAPI  # issue 26: TorchRec's staged API (awaitables)

__all__ = ["ShardedEmbeddingBagCollection", "shard", "shard_resolved"]


@dataclass
class _Group:
    sharding_type: ShardingType
    spec: GroupSpec
    routing: Routing
    store: ShardStore
    stages: Stages
    replicated: bool


def _param_groups(settings: dict, names: list) -> tuple:
    """(rules, param-group dicts, {table: group index | None}): tables with the same optimizer setting
    share one group, in table order (the same on every rank)."""
    rules, groups, index, table_group = [], [], {}, {}
    for n in names:
        got = settings.get(n)
        if got is None:
            table_group[n] = None
            continue
        rule, hp = got
        key = (rule.name, tuple(sorted((k, repr(v)) for k, v in hp.items())))
        if key not in index:
            index[key] = len(groups)
            rules.append(rule)
            groups.append({"params": [], **hp})
        table_group[n] = index[key]
    return rules, groups, table_group


class ShardedEmbeddingBagCollection(TorchRecShardedAPI, nn.Module):
    """An EmbeddingBagCollection whose tables are split over ranks; built by :func:`shard`.

    ``forward(kjt)`` takes this rank's local batch and returns what the unsharded module returns
    for it. Training: call ``backward`` on the loss; the fused optimizer updates the local shards
    during backward (there is no separate ``step``).

    Example:
        >>> import functools; from shardwise.embedding import EmbeddingBagConfig, row_wise
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])])
        >>> sharded = shard(ebc, {"t0": row_wise()}, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
        >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))  # this rank's batch
        >>> kt = sharded(kjt); torch.equal(kt.values(), ebc(kjt).values())   # what the unsharded module gives
        True
        >>> kt.values().sum().backward()                                     # SGD updates the shards here
        >>> sharded.state_dict()["embedding_bags.t0.weight"].full_tensor().shape
        torch.Size([10, 4])
    """

    _prefix = "embedding_bags"   # state-dict keys: <_prefix>.<table>.weight (the unsharded module's names)
    _takes_variable_batch = True   # VBE batches (TorchRec's inverse_indices); the sequence module refuses them
    _local_shortcut = True   # one rank, every table whole on it: look up without routing (sharding/local.py)

    def __init__(self, ebc: EmbeddingBagCollection, plan: dict, topo: MeshTopology, optimizer=None,
                 compile_optimizer: bool = False, gradient_division: bool = True, load_sample_every: int = 4):
        super().__init__()
        self._tables = ebc.tables
        self._is_weighted = ebc.is_weighted
        self._topo = topo
        self._features = ebc.feature_names()
        self._dims = [t.embedding_dim for t in self._tables for _ in t.feature_names]
        cols, start = {}, 0
        for f, d in zip(self._features, self._dims):
            cols[f], start = start, start + d
        self._total_dim = start
        self._mean_mask = [getattr(t, "pooling", "sum") == "mean" for t in self._tables for _ in t.feature_names]
        self._rows = {f: t.num_embeddings for t in self._tables for f in t.feature_names}
        settings = optimizer if isinstance(optimizer, dict) else table_optimizers(ebc, optimizer)
        rules, groups, table_group = _param_groups(settings, [t.name for t in self._tables])
        self._compile = bool(compile_optimizer)
        # TorchRec's default: each rank's embedding gradient divided by the world size (the gradient of
        # the mean of per-rank losses, as DDP averages the dense part)
        self.gradient_division = bool(gradient_division)
        self._grad_scale = 1.0 / topo.world_size if gradient_division else 1.0
        for i, rule in enumerate(rules):
            self._check_rule(rule, {t: plan[t] for t, k in table_group.items() if k == i})
        weights = shard_source(ebc, self._tables)
        self._dtype = table_weight(ebc, self._tables[0].name).dtype
        # A leaf that every backward collective hangs on, so ranks without shards still take part.
        self._anchor = torch.empty(0, device=topo.device, requires_grad=True)
        self._groups: list[_Group] = []
        self._warned_frozen = False
        order = sorted(set(table_group.values()), key=lambda k: -1 if k is None else k)
        for st in ShardingType:   # enum order, then optimizer group order: the same on every rank
            for k in order:
                tables = [t for t in self._tables if plan[t.name].sharding_type == st and table_group[t.name] == k]
                if tables:
                    rule, hp = (None, None) if k is None else (rules[k], groups[k])
                    self._groups.append(self._build_group(st, tables, plan, cols, weights, rule, hp))
        self.fused_optimizer = FusedOptimizer(self, rules, groups, table_group)
        # per-table id counts of every forward, for load_stats() / propose_rebalance()
        self._lookup_counter = LookupCounter(self._tables, topo.device, every=load_sample_every)
        self._prefetched: Optional[PendingInput] = None   # set by a pipeline: the next forward's batch
        self._local, self._local_of = None, None   # the LocalLookup of the groups _local_of (sharding/local.py)

    @staticmethod
    def _check_rule(rule, plan) -> None:
        if rule is not None and rule.row_state:
            cw = sorted(n for n, ps in plan.items() if ps.sharding_type == ShardingType.COLUMN_WISE)
            if cw:
                raise ValueError(f"{rule.name} keeps one accumulator per row, but column-wise tables {cw} split "
                                 f"rows over ranks; use Adagrad or another sharding type for them")

    def _build_group(self, st, tables, plan, cols, weights, rule, hp) -> _Group:
        topo, sharder = self._topo, SHARDERS[st]
        boxes = [b for t in tables for b in sharder.layout(t, plan[t.name], topo)]
        spec = GroupSpec(tables, boxes, cols, self._total_dim)
        routing = Routing(spec, topo.world_size, topo.rank if sharder.local_only else None)
        # large local tables: the store calls the compiled one-pass kernel itself (optim/row_update.py)
        compiled = self._compile or store_compiles(rule, routing.boxes, topo.rank, topo.device, self._dtype)
        store = ShardStore(routing.boxes, topo.rank, weights, topo.device, rule, hp,
                           sync_group=topo.group if sharder.replicated else None, compiled=compiled,
                           dtype=self._dtype, grad_scale=self._grad_scale)
        if rule is None:
            store.no_rule_hook = self._warn_frozen
        stages = self._make_stages(sharder, routing, store)
        stages.output_dist.set_qcomm(self._qcomm_codecs)   # quantized comms (use_qcomm), kept across reshards
        return _Group(st, spec, routing, store, stages, sharder.replicated)

    def _make_stages(self, sharder, routing: Routing, store: ShardStore) -> Stages:
        """The three stages of one group (pooled here; a subclass may return other output stages)."""
        return sharder.build(routing, self._topo, store, self._anchor, self._is_weighted, self._dtype)

    def extra_repr(self) -> str:
        """One line per table: shape, sharding type, ranks and optimizer (what ``print(model)`` shows)."""
        plan, lines = self.sharding_plan(), []
        for t in self._tables:
            ps = plan[t.name]
            rule, hp = self.fused_optimizer.table_rule(t.name)
            opt = describe(rule, hp) if rule is not None else "no optimizer"
            ranks = f"ranks {list(ps.ranks)}" if ps.ranks else "every rank"
            lines.append(f"{t.name}: {t.num_embeddings}x{t.embedding_dim} {ps.sharding_type.value} on {ranks}, {opt}")
        return f"world_size={self._topo.world_size}\n" + "\n".join(lines)

    def _warn_frozen(self) -> None:
        if not self._warned_frozen:
            self._warned_frozen = True
            bare = [t for t, k in self.fused_optimizer._table_group.items() if k is None]
            warnings.warn(f"{type(self).__name__}: a backward reached tables {bare}, which have no optimizer (shard() "
                          f"without optimizer= is forward-only), so their weights do not change; pass shard(..., "
                          f"optimizer=...) or apply_optimizer_in_backward on their weights to train them", stacklevel=2)

    @property
    def tables(self):
        return list(self._tables)

    @property
    def optimizer(self) -> FusedOptimizer:
        """The fused optimizer (``state_dict()`` / ``load_state_dict()``); same as ``fused_optimizer``."""
        return self.fused_optimizer

    def load_stats(self, reset: bool = False):
        """Collective: ids looked up per table since construction (or the last reshard / reset),
        summed over ranks, as a :class:`~shardwise.embedding.reshard.load.LoadStats` -- per table: ids
        per step in row buckets and per asking rank, the current boxes and bytes per element. It is
        the input of :func:`~shardwise.embedding.propose_rebalance`.

        Example:
            >>> from shardwise.embedding import EmbeddingBagConfig, row_wise
            >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])]), {"t0": row_wise()})
            >>> kt = sharded(KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1])))
            >>> sharded.load_stats().per_rank()          # ids x columns per step, one rank here: 3 x 4
            [12.0]
        """
        from .reshard.load import load_stats
        return load_stats(self, reset)

    def reshard(self, changes: dict, **kwargs):
        """Collective: move tables to new shardings with all their optimizer state; see
        :func:`shardwise.embedding.reshard`.

        Example:
            >>> from shardwise.embedding import EmbeddingBagConfig, row_wise, table_wise
            >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])]), {"t0": row_wise()})
            >>> sharded.reshard({"t0": table_wise(0)}).tables_moved
            ['t0']
        """
        from .reshard.api import reshard
        return reshard(self, changes, **kwargs)

    def _reset_load_stats(self) -> None:
        self._lookup_counter.reset()

    def sharding_plan(self) -> dict:
        """``{table: ParameterSharding}`` that reproduces the current boxes, in config order (each
        sharding class reads its own boxes back).

        Example:
            >>> from shardwise.embedding import EmbeddingBagConfig, row_wise
            >>> shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])]), {"t0": row_wise()}).sharding_plan()["t0"]
            ParameterSharding(sharding_type=<ShardingType.ROW_WISE: 'row_wise'>, ranks=(0,), host_index=None)
        """
        out = {}
        for g in self._groups:
            for t in g.spec.tables:
                boxes = [b for b in g.spec.boxes if b.table == t.name]
                out[t.name] = SHARDERS[g.sharding_type].sharding_of(boxes, self._topo)
        return {t.name: out[t.name] for t in self._tables}

    def boxes(self) -> list[ShardBox]:
        """Every shard of every table (all ranks), the single source of the routing."""
        return [b for g in self._groups for b in g.spec.boxes]

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
        pending = self._prefetched
        if pending is not None and pending.source is kjt:   # a pipeline started this batch already
            self._prefetched = None
            return self.forward_from(pending)
        return self.forward_from(self.start_input_dist(kjt))

    def start_input_dist(self, kjt: KeyedJaggedTensor) -> PendingInput:
        """Collective, first half of ``forward``: check this rank's batch, move it to the device, route
        its ids and start the id all-to-alls without waiting for them; :meth:`forward_from` finishes.
        Every rank starts its batches in the same order. Batch sizes may differ between ranks and steps:
        they travel in the all-to-all's header, as do "my batch is bad" flags, so a bad batch on one
        rank makes every rank raise in ``forward_from``.

        Example (a pipeline: the ids of the next batch travel while this one computes):
            >>> from shardwise.embedding import EmbeddingBagConfig, row_wise
            >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])]), {"t0": row_wise()})
            >>> batches = [KeyedJaggedTensor(["f"], torch.tensor([i]), lengths=torch.tensor([1])) for i in range(3)]
            >>> pending = sharded.start_input_dist(batches[0])
            >>> for nxt in batches[1:]:
            ...     current, pending = pending, sharded.start_input_dist(nxt)
            ...     sharded.forward_from(current).values().sum().backward()
            >>> sharded.forward_from(pending).values().sum().backward()   # the last batch
        """
        padded, vbe, problem = kjt, None, None
        if self._takes_variable_batch:
            try:   # VBE: the deduplicated bags travel, padded to a common count; expanded after the lookup
                padded, vbe = split_variable_batch(kjt)
            except ValueError as exc:
                problem = f"ValueError: {exc}"
        local = self._local_lookup()
        if local is not None:   # the id range check runs inside the local lookup
            pending = start_local(self, padded, problem or self._check_batch(padded, ids=False), local)
        else:
            pending = start_groups(self, padded, problem or self._check_batch(padded))
        pending.source, pending.vbe = kjt, vbe
        return pending

    def _local_lookup(self) -> Optional[LocalLookup]:
        """The lookup without routing (sharding/local.py) while this module allows it, else None."""
        return local_lookup(self)

    def forward_from(self, pending: PendingInput) -> KeyedTensor:
        """Collective, second half of ``forward``: wait for ``pending``'s ids (from
        :meth:`start_input_dist`), look them up and send the pooled rows back to their samples.

        Example:
            >>> from shardwise.embedding import EmbeddingBagConfig, row_wise
            >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])]), {"t0": row_wise()})
            >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1]), lengths=torch.tensor([1]))
            >>> torch.equal(sharded.forward_from(sharded.start_input_dist(kjt)).values(), sharded(kjt).values())
            True
        """
        if pending.module is not self or pending.stale:
            raise ValueError("forward_from: this batch was started on another module or before a reshard changed "
                             "the layout; start it again with start_input_dist (after pending.drop())")
        pending.claim()
        pending.advance()
        if pending.bad_ranks:
            self._raise_everywhere(pending.problem, pending.bad_ranks)
        out = finish_local(self, pending) if pending.local_lookup is not None else self._lookup_pending(pending)
        # the load that feeds rebalancing (every k-th forward), once the batch's ids passed their check
        self._lookup_counter.sample(pending.kjt, checked=True)
        return out

    def _lookup_pending(self, pending: PendingInput) -> KeyedTensor:
        """Look up a checked batch whose ids arrived and send the pooled rows back to their samples."""
        kjt, batch, sizes = pending.kjt, pending.batch, pending.sizes
        blocks: dict = {}
        for i, g in enumerate(self._groups):
            routed = pending.routed(i)
            pooled = g.stages.lookup(routed)
            for f, c0, blk in g.stages.output_dist(pooled, routed, batch, sizes):
                blocks.setdefault(f, []).append((c0, blk))
        pieces = [self._assemble(f, blocks.get(f, []), batch, kjt if mean else None)
                  for f, mean in zip(self._features, self._mean_mask)]
        if pending.vbe is not None:
            pieces = [pending.vbe.expand(f, p) for f, p in zip(self._features, pieces)]
        return KeyedTensor(self._features, self._dims, torch.cat(pieces, dim=1))

    def _check_features(self, kjt) -> None:
        check_features(kjt, self._features, self._is_weighted)

    def _check_batch(self, kjt, ids: bool = True) -> Optional[str]:
        """This rank's problem with its batch (None if fine): type, features, weights, id range (``ids``)."""
        return batch_problem(kjt, self._check_features, self._rows, ids)

    def _raise_everywhere(self, problem: Optional[str], bad_ranks: list) -> None:
        raise_everywhere(problem, bad_ranks, self._topo)

    def _assemble(self, feature: str, parts: list, batch: int, mean_kjt) -> torch.Tensor:
        """One feature's [batch, dim] output: add row-block partials, place column blocks."""
        by_col: dict = {}
        for c0, blk in parts:   # arrival order is fixed by the routing, so sums are deterministic
            by_col[c0] = blk if c0 not in by_col else by_col[c0] + blk
        if not by_col:
            dim = self._dims[self._features.index(feature)]
            return torch.zeros(batch, dim, dtype=self._dtype, device=self._topo.device)
        cols = [by_col[c] for c in sorted(by_col)]
        out = cols[0] if len(cols) == 1 else torch.cat(cols, dim=1)
        if mean_kjt is not None and feature in mean_kjt.keys():
            k = mean_kjt.keys().index(feature)
            n = mean_kjt.lengths()[k * batch:(k + 1) * batch].clamp(min=1).to(self._dtype)
            out = out / n.unsqueeze(1)
        return out

    # ---- state ----------------------------------------------------------------------------------
    def _table_shards(self, what: Optional[str] = None, per_row: bool = False):
        """Per table: (config, all boxes, {my box: view}, replicated, group) for the weights
        (``what=None``) or an optimizer state buffer (``per_row``: one value per row)."""
        out = []
        for g in self._groups:
            for t in g.spec.tables:
                boxes = [b for b in g.spec.boxes if b.table == t.name]
                local = {}
                for b in boxes:
                    if b.rank != self._topo.rank:
                        continue
                    if b in g.routing.boxes:
                        local[b] = g.store.box_view(g.routing.boxes.index(b), what)
                    else:
                        shape = (b.row_size,) if per_row else (b.row_size, b.col_size)  # one is 0
                        dtype = self._dtype if what is None else STATE_DTYPE
                        local[b] = torch.zeros(shape, dtype=dtype, device=self._topo.device)
                out.append((t, boxes, local, g.replicated, g))
        order = {t.name: i for i, t in enumerate(self._tables)}
        return sorted(out, key=lambda x: order[x[0].name])

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False) -> dict:
        """``{prefix + "embedding_bags.<table>.weight": DTensor | ShardedTable}`` viewing the live shards
        (``embeddings.<table>.weight`` for a sharded EmbeddingCollection)."""
        out = OrderedDict() if destination is None else destination
        for t, boxes, local, replicated, _ in self._table_shards():
            size = (t.num_embeddings, t.embedding_dim)
            out[f"{prefix}{self._prefix}.{t.name}.weight"] = wrap_shards(boxes, local, size, self._topo,
                                                                         replicated, self._dtype)
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Copy weights from DTensors, ShardedTables or whole plain tensors into the local shards."""
        keys = [f"{self._prefix}.{t.name}.weight" for t in self._tables]
        missing = [k for k in keys if k not in state_dict]
        unexpected = sorted(k for k in state_dict if k not in keys)
        if strict and (missing or unexpected):
            raise ValueError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}; pass "
                             f"strict=False to load a subset")
        for t in self._tables:   # every value first: a bad later table must not leave earlier ones loaded
            key, size = f"{self._prefix}.{t.name}.weight", (t.num_embeddings, t.embedding_dim)
            if key in state_dict and not isinstance(state_dict[key], torch.Tensor):
                raise TypeError(f"{key}: a {type(state_dict[key]).__name__} is not a tensor; load tensors, "
                                f"DTensors or ShardedTables of shape {size} (nothing was loaded)")
            if key in state_dict and tuple(state_dict[key].shape) != size:
                raise ValueError(f"{key}: shape {tuple(state_dict[key].shape)} does not match the table's {size}; "
                                 f"load a state dict of the same tables (nothing was loaded)")
        for t, boxes, local, replicated, _ in self._table_shards():
            key = f"{self._prefix}.{t.name}.weight"
            if key in state_dict:
                copy_into_shards(state_dict[key], boxes, local, (t.num_embeddings, t.embedding_dim),
                                 self._topo, replicated, key)
        return missing, unexpected


from .shard_api import shard, shard_resolved  # noqa: E402  (the entry point lives in shard_api.py; kept here for imports)
