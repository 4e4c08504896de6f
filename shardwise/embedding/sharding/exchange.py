"""The input dist as two asynchronous all-to-alls, so a pipeline can run them while another batch computes.

1. header: 3 ints per (source, destination) pair -- the source's batch size, its "my batch is bad"
   flag and how many ids it sends there. Every rank receives every rank's header, so batch sizes and
   bad-batch flags travel here instead of in a separate all-gather, and every rank takes the same
   decision (skip the lookup and raise) from the same numbers.
2. ids: per destination the bag lengths followed by the ids in one int64 buffer (and the weights of a
   weighted collection in a second one), split by the sizes the headers announced.

Example (what ShardedEmbeddingBagCollection.start_input_dist does per group)::

    ex = IdExchange(group.stages.input_dist, group.stages.input_dist.route(kjt), flag=0)
    ex.headers(); ex.send_ids(); routed = ex.routed()
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .comm import all_gather_ints

__all__ = ["IdExchange", "PendingInput", "start_groups"]

_HEADER = 3   # batch size, bad-batch flag, ids sent


class IdExchange:
    """One group's input dist in flight. ``local`` is ``InputDist.route(kjt)`` (None for a bad batch,
    which announces itself with ``flag=1`` and sends nothing else)."""

    def __init__(self, input_dist, local: Optional[tuple], flag: int):
        self.dist, self.topo = input_dist, input_dist.topo
        world, dev = self.topo.world_size, self.topo.device
        if local is None:
            self.ids = self.lengths = self.weights = self.sent = None
            self.batch, val_in = 0, torch.zeros(world, dtype=torch.int64, device=dev)
        else:
            self.ids, lengths, self.weights, slot_len, self.batch, self.sent = local
            self.lengths = lengths.to(torch.int64)
            val_in = torch.zeros(world, dtype=torch.int64, device=dev).index_add_(0, input_dist.slot_dest, slot_len)
        header = torch.stack([torch.full_like(val_in, self.batch), torch.full_like(val_in, int(flag)), val_in], 1)
        self._val_in = val_in
        self._head = torch.empty(world * _HEADER, dtype=torch.int64, device=dev)
        self._works = [dist.all_to_all_single(self._head, header.flatten(), group=self.topo.group, async_op=True)]
        self._heads: Optional[list] = None
        self._recv = None

    def headers(self) -> list:
        """[(batch size, flag, ids sent here)] per source rank (waits for the header all-to-all)."""
        if self._heads is None:
            self._works.pop(0).wait()
            self._heads = self._head.view(self.topo.world_size, _HEADER).tolist()
        return self._heads

    def send_ids(self) -> None:
        """Start the lengths + ids all-to-all (every rank calls it, or none: see the flags first)."""
        heads, d = self.headers(), self.dist
        mine = d.slots_per_dest[self.topo.rank]
        len_out = [mine * b for b, _, _ in heads]
        val_out = [n for _, _, n in heads]
        len_in = [n * self.batch for n in d.slots_per_dest]
        val_in = self._val_in.tolist()
        parts = zip(torch.split(self.lengths, len_in), torch.split(self.ids, val_in))
        send = torch.cat([t for pair in parts for t in pair])
        out = [a + b for a, b in zip(len_out, val_out)]
        recv = send.new_empty(sum(out))
        group = self.topo.group
        self._works.append(dist.all_to_all_single(recv, send, out, [a + b for a, b in zip(len_in, val_in)],
                                                  group=group, async_op=True))
        recv_w = None
        if self.weights is not None:
            recv_w = self.weights.new_empty(sum(val_out))
            self._works.append(dist.all_to_all_single(recv_w, self.weights.contiguous(), val_out, val_in,
                                                      group=group, async_op=True))
        self._recv = (recv, recv_w, len_out, val_out)

    def routed(self):
        """This rank's received ids as a :class:`~.stages.Routed` (waits for the ids all-to-all)."""
        self.wait()
        recv, recv_w, len_out, val_out = self._recv
        pieces = torch.split(recv, [n for pair in zip(len_out, val_out) for n in pair])
        lengths, ids = torch.cat(pieces[0::2]), torch.cat(pieces[1::2])
        routed = self.dist._per_width(ids, lengths, recv_w, [b for b, _, _ in self.headers()])
        if self.sent is not None:
            routed.sent = self.sent
        return routed

    def wait(self) -> None:
        """Finish whatever is still in flight (also to drop a batch whose layout went stale)."""
        while self._works:
            self._works.pop(0).wait()


class PendingInput:
    """A batch whose input dist is under way, made by a sharded collection's ``start_input_dist``;
    its ``forward_from`` finishes it. ``advance()`` (optional) takes the headers in and sends the ids,
    so a pipeline can let that all-to-all run too before the lookup needs it.

    ``groups`` is the collection's group list when the batch was routed: a reshard replaces it, and
    the batch must then be routed again (``stale``).
    """

    def __init__(self, module, source, kjt, problem: Optional[str], exchanges: list, local: list,
                 agreed: Optional[list] = None):
        self.module, self.source, self.kjt, self.problem = module, source, kjt, problem
        self.groups, self.exchanges, self.local = module._groups, exchanges, local
        self.batch = kjt.stride() if problem is None else 0
        self.sizes = self.bad_ranks = None
        self.vbe = None   # a VBE batch's VariableBatch (the module expands its output rows)
        self.local_lookup = None   # a LocalLookup (local.py): looked up where it sits, nothing routed
        self._advanced, self._claimed = agreed is not None, False
        if agreed is not None:   # no group exchanges ids: sizes and flags came with an all-gather
            self.sizes = [b for b, _ in agreed]
            self.bad_ranks = [r for r, (_, flag) in enumerate(agreed) if flag]

    @property
    def stale(self) -> bool:
        return self.groups is not self.module._groups

    def advance(self) -> None:
        """Take the headers in; unless some rank's batch is bad (then every rank skips), send the ids."""
        if self._advanced:
            return
        self._advanced = True
        heads = next(ex for ex in self.exchanges if ex is not None).headers()
        self.sizes = [b for b, _, _ in heads]
        self.bad_ranks = [r for r, (_, flag, _) in enumerate(heads) if flag]
        if not self.bad_ranks:
            for ex in self.exchanges:
                if ex is not None:
                    ex.send_ids()

    def claim(self) -> None:
        """Mark the batch looked up: its received ids are read once."""
        if self._claimed:
            raise ValueError("forward_from: this batch was looked up already; start each batch once per forward "
                             "(start_input_dist)")
        self._claimed = True

    def routed(self, i: int):
        return self.local[i] if self.exchanges[i] is None else self.exchanges[i].routed()

    def drop(self) -> None:
        """Finish the collectives in flight and forget the routed ids (every rank at the same point)."""
        self.advance()
        for ex in self.exchanges:
            if ex is not None:
                ex.wait()


def start_groups(module, kjt, problem: Optional[str]) -> PendingInput:
    """Start the input dist of ``kjt`` (this rank's batch; ``problem``: why it is bad, or None) for
    every group of ``module`` (a sharded collection: ``_groups``, ``_topo``)."""
    topo = module._topo
    local_kjt = kjt.to(topo.device) if problem is None and kjt.values().device != topo.device else kjt
    flag = int(problem is not None)
    exchanges, local = [], []
    for g in module._groups:
        ind = g.stages.input_dist
        if ind.exchange:
            exchanges.append(IdExchange(ind, None if flag else ind.route(local_kjt), flag))
            local.append(None)
        else:
            exchanges.append(None)
            local.append(None if flag else _local_routed(ind, local_kjt, topo.world_size))
    agreed = None
    if all(ex is None for ex in exchanges):
        # no ids cross ranks, but a bad batch must still stop every rank (before the backward's
        # all-reduce would leave the others waiting): one small all-gather of sizes and flags
        batch = kjt.stride() if problem is None else 0
        agreed = all_gather_ints([batch, flag], topo.world_size, topo.group, topo.device)
    return PendingInput(module, kjt, local_kjt, problem, exchanges, local, agreed)


def _local_routed(ind, kjt, world: int):
    """A group whose ids stay on this rank (data-parallel): routed without an exchange."""
    ids, lengths, weights, _, batch, sent = ind.route(kjt)
    routed = ind._per_width(ids, lengths, weights, [batch] * world)
    if sent is not None:   # sequence output: each id's input position
        routed.sent = sent
    return routed
