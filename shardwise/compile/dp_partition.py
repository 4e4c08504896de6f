"""Build the per-rank data-parallel graph from a traced joint graph.

Layout of the result (before passes reorder collectives):

* placeholders: parameter storage (full or padded shard), buffers,
  optimizer state, one float64 learning rate per param group, the ranks' agreement bits (world > 1;
  a gradient bucket carries them, see ``agreement.py``), batch tensors;
* for a sharded parameter, one all-gather feeds forward uses and a second
  one feeds backward uses (forward-only views of the parameter are
  recomputed from it), so nothing gathered stays alive in between;
* each gradient is all-reduced (replicated) or padded and reduce-scattered
  (sharded), then divided by the world size (DDP's averaging): inside the optimizer's fused kernel
  (its ``grad_scale``, no pass of its own), or by a division before a per-parameter update;
* the optimizer, traced on shard shapes, is inlined last; it updates the
  parameter/state placeholders in place, like torch (these writes come
  after every read of the parameter in forward and backward).

Example::

    gm, sig = build_dp_graph(joint, state, spec, world=2, group_name="0")
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from .agreement import DIGEST_BITS
from .classify import param_derived
from .graph_utils import ATEN, C10D, Builder
from .modes import Signature
from .optim import functional_update, state_names

__all__ = ["build_dp_graph"]


class _DPBuilder:
    def __init__(self, joint, state, spec, world: int, group_name: str, fake_mode):
        self.joint, self.state, self.spec = joint, state, spec
        self.world, self.gname = world, group_name
        self.graph = torch.fx.Graph()
        self.b = Builder(self.graph, fake_mode)
        self.fake = fake_mode
        self.sig = Signature()
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.fwd_full: dict[str, torch.fx.Node] = {}
        self.bwd_memo: dict[torch.fx.Node, torch.fx.Node] = {}
        self.storage_ph: dict[str, torch.fx.Node] = {}
        self.state_ph: dict[str, dict[str, torch.fx.Node]] = {}
        self.lr_ph: list[torch.fx.Node] = []
        jph = [n for n in joint.gm.graph.nodes if n.op == "placeholder"]
        self.param_ph = {n.meta["sw_fqn"]: n for n in jph if n.meta["sw_kind"] == "param"}
        self.root_of: dict[torch.fx.Node, str] = {}
        for fqn, node in self.param_ph.items():
            if state.layouts[fqn].sharded:
                for d in param_derived(joint.gm.graph, node):
                    self.root_of[d] = fqn

    # -- placeholders --------------------------------------------------------------------------
    def add_placeholders(self, local_batch_tensors: list[torch.Tensor]) -> None:
        st, b = self.state, self.b
        for fqn in self.joint.param_names:
            self.storage_ph[fqn] = b.placeholder(
                _safe(f"p_{fqn}"), st.storage[fqn], {"sw_kind": "param", "sw_fqn": fqn}
            )
            self.sig.inputs.append(("param", fqn, None))
        jph = [n for n in self.joint.gm.graph.nodes if n.op == "placeholder"]
        for node in jph:
            if node.meta["sw_kind"] == "param":
                continue
            if node.meta["sw_kind"] == "buffer":
                fqn = node.meta["sw_fqn"]
                self.env[node] = b.placeholder(_safe(f"b_{fqn}"), node.meta["val"], dict(node.meta))
                self.sig.inputs.append(("buffer", fqn, None))
        for fqn in self.updated():
            self.state_ph[fqn] = {}
            for k in sorted(st.states[fqn]):
                self.state_ph[fqn][k] = b.placeholder(
                    _safe(f"s_{fqn}_{k}"), st.states[fqn][k], {"sw_kind": "opt_state", "sw_fqn": fqn}
                )
                self.sig.inputs.append(("opt_state", fqn, k))
        for gi in range(len(self.spec.groups)):
            lr = torch.zeros((), dtype=torch.float64, device=_device(st))
            self.lr_ph.append(b.placeholder(f"lr_{gi}", lr, {"sw_kind": "hparam"}))
            self.sig.inputs.append(("lr", gi, None))
        if self.world > 1:  # the ranks' agreement bits, carried by a gradient bucket (agreement.py)
            bits = torch.zeros(DIGEST_BITS, dtype=torch.float32, device=_device(st))
            b.placeholder("agree_bits", bits, {"sw_kind": "agreement", "sw_group": self.gname})
            self.sig.inputs.append(("agree", None, None))
        batch_ph = [n for n in jph if n.meta["sw_kind"] == "input"]
        for i, (node, t) in enumerate(zip(batch_ph, local_batch_tensors)):
            self.env[node] = b.placeholder(f"input_{i}", t, {"sw_kind": "input", "sw_fqn": None})
            self.sig.inputs.append(("input", i, None))

    def updated(self) -> list[str]:
        """Parameters the optimizer updates this step (have a group and a gradient)."""
        return [
            fqn for fqn, has in zip(self.joint.param_names, self.joint.has_grad)
            if has and self.state.group_of[fqn] is not None
        ]

    # -- parameter gathers ---------------------------------------------------------------------
    def gather(self, fqn: str, role: str) -> torch.fx.Node:
        lay = self.state.layouts[fqn]
        meta = {"sw_role": role, "sw_fqn": fqn, "sw_kind": "param"}
        ag = self.b.call(C10D.all_gather_into_tensor.default, self.storage_ph[fqn], self.world,
                         self.gname, meta=meta)
        full = self.b.call(C10D.wait_tensor.default, ag, meta=meta)
        if lay.padded_rows != lay.shape[0]:
            full = self.b.call(ATEN.slice.Tensor, full, 0, 0, lay.shape[0], meta=meta)
        return full

    def fwd_value(self, node: torch.fx.Node) -> torch.fx.Node:
        if node in self.env:
            return self.env[node]
        fqn = node.meta["sw_fqn"]
        assert node.op == "placeholder" and node.meta["sw_kind"] == "param", node
        if not self.state.layouts[fqn].sharded:
            return self.storage_ph[fqn]
        if fqn not in self.fwd_full:
            self.fwd_full[fqn] = self.gather(fqn, "gather_fwd")
        return self.fwd_full[fqn]

    def bwd_value(self, node: torch.fx.Node) -> torch.fx.Node:
        """Recompute a forward parameter-only value from the backward all-gather."""
        if node not in self.bwd_memo:
            if node.op == "placeholder":
                self.bwd_memo[node] = self.gather(self.root_of[node], "gather_bwd")
            else:
                new = self.graph.node_copy(node, self.bwd_value)
                new.meta["sw_region"] = "backward"
                self.bwd_memo[node] = new
        return self.bwd_memo[node]

    # -- joint body ----------------------------------------------------------------------------
    def copy_joint(self) -> list:
        for node in self.joint.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                return [self.env[a] if a is not None else None for a in node.args[0]]
            backward = node.meta.get("sw_region") == "backward"

            def arg(a, backward=backward):
                if backward and a in self.root_of:
                    return self.bwd_value(a)
                return self.fwd_value(a)

            self.env[node] = self.graph.node_copy(node, arg)
        raise AssertionError("joint graph without output")

    # -- gradient synchronisation --------------------------------------------------------------
    def sync_grad(self, fqn: str, grad: torch.fx.Node) -> torch.fx.Node:
        lay, b = self.state.layouts[fqn], self.b
        meta = {"sw_role": "grad_sync", "sw_fqn": fqn, "sw_kind": "grad"}
        if lay.sharded:
            pad = lay.padded_rows - lay.shape[0]
            if pad:
                grad = b.call(ATEN.constant_pad_nd.default, grad, [0, 0] * (grad.meta["val"].dim() - 1) + [0, pad], 0.0, meta=meta)
            red = b.call(C10D.reduce_scatter_tensor.default, grad, "sum", self.world, self.gname, meta=meta)
        else:
            red = b.call(C10D.all_reduce.default, grad, "sum", self.gname, meta=meta)
        return b.call(C10D.wait_tensor.default, red, meta=meta)  # a sum: the optimizer averages

    # -- optimizer -----------------------------------------------------------------------------
    def inline_optimizer(self, grads: dict[str, torch.fx.Node], order: list[str], bucket_of: dict) -> tuple[list, list]:
        """Inline the optimizer, updating parameters in ``order`` (gradient readiness), one call per run of
        parameters sharing a param group and a gradient bucket: with fused kernels each bucket's update
        starts as soon as that bucket arrives, while later buckets are still in flight."""
        fqns = order
        st, spec = self.state, self.spec
        names = {f: sorted(self.state_ph[f]) for f in fqns}
        runs: list[list[int]] = []
        for i, f in enumerate(fqns):
            key = (st.group_of[f], bucket_of.get(f))
            if runs and (st.group_of[fqns[runs[-1][0]]], bucket_of.get(fqns[runs[-1][0]])) == key:
                runs[-1].append(i)
            else:
                runs.append([i])

        def opt_fn(shards, gs, states, lrs):
            new_p, new_s = [], []
            for idx in runs:
                gi = st.group_of[fqns[idx[0]]]
                group = spec.groups[gi]
                ps, ss = functional_update(
                    group, [shards[i] for i in idx], [gs[i] for i in idx],
                    [dict(zip(names[fqns[i]], states[i])) for i in idx], lrs[gi], grad_scale=self.world,
                )
                for i, p, s in zip(idx, ps, ss):
                    new_p.append((i, p))
                    wanted = state_names(group, has_state=True)
                    new_s.append((i, [s[k] for k in wanted if k in s]))
            new_p.sort(key=lambda t: t[0])
            new_s.sort(key=lambda t: t[0])
            return [p for _, p in new_p], [s for _, s in new_s]

        ph = lambda n: n.meta["val"]  # noqa: E731 - fake values of our placeholders
        args = (
            [ph(self.storage_ph[f]) for f in fqns], [grads[f].meta["val"] for f in fqns],
            [[ph(self.state_ph[f][k]) for k in names[f]] for f in fqns], [ph(n) for n in self.lr_ph],
        )
        opt_gm = make_fx(opt_fn, tracing_mode="fake")(*args)
        sources = (
            [self.storage_ph[f] for f in fqns], [grads[f] for f in fqns],
            [[self.state_ph[f][k] for k in names[f]] for f in fqns], list(self.lr_ph),
        )
        out = _inline(self.graph, opt_gm, pytree.tree_leaves(sources))
        new_p, new_s = out[: len(fqns)], out[len(fqns):]
        state_keys = []
        for f in fqns:
            group = spec.groups[st.group_of[f]]
            state_keys += [(f, k) for k in state_names(group, has_state=True)]
        for n in new_s:  # includes lazily created state (SGD's first momentum buffer)
            n.meta["sw_kind"] = "opt_state"
        return list(zip(fqns, new_p)), list(zip(state_keys, new_s))


def _inline(graph: torch.fx.Graph, sub: torch.fx.GraphModule, inputs: list) -> list:
    env = {}
    phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
    assert len(phs) == len(inputs), (len(phs), len(inputs))
    env.update(zip(phs, inputs))
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            return [env[a] for a in pytree.tree_leaves(node.args[0])]
        new = env[node] = graph.node_copy(node, lambda a: env[a])
        new.meta["sw_region"] = "optimizer"
        root = _alias_root(new)  # an in-place update is the parameter/state it writes
        if root is not new and root.op == "placeholder":
            new.meta["sw_kind"], new.meta["sw_fqn"] = root.meta.get("sw_kind"), root.meta.get("sw_fqn")
        else:
            is_t = isinstance(new.meta.get("val"), torch.Tensor)
            new.meta["sw_kind"], new.meta["sw_fqn"] = ("activation" if is_t else "non_tensor"), None
            new.meta["sw_writes"] = _list_writes(new)
    raise AssertionError("optimizer graph without output")


def build_dp_graph(joint, state, spec, world: int, group_name: str, fake_mode, local_batch,
                   bucket_cap_bytes: int = 4 << 20):
    """Return ``(GraphModule, Signature)`` for this rank (see module docstring)."""
    from .passes.grad_bucketing import plan_buckets, sync_collectives

    d = _DPBuilder(joint, state, spec, world, group_name, fake_mode)
    d.add_placeholders([t for t in pytree.tree_leaves(local_batch) if isinstance(t, torch.Tensor)])
    outs = d.copy_joint()
    user, grads = outs[: joint.n_user_out], outs[joint.n_user_out:]
    grad_of = dict(zip(joint.param_names, grads))
    synced = {f: d.sync_grad(f, grad_of[f]) for f in d.updated()}
    # update parameters in the order their gradients are ready (the backward's order), so the
    # optimizer starts on the first synced bucket while later buckets are still in flight
    pos = {n: i for i, n in enumerate(d.graph.nodes)}
    order = sorted(d.updated(), key=lambda f: pos[grad_of[f]])
    # the buckets the gradient pass will form (the same pure plan on the same graph order)
    buckets = plan_buckets(sync_collectives(d.graph), pos, bucket_cap_bytes)
    bucket_of = {c.meta["sw_fqn"]: k for k, bucket in enumerate(buckets) for c in bucket}
    new_params, new_states = d.inline_optimizer(synced, order, bucket_of)
    # Write results into the storage right where they are computed: the
    # DTensors in the model/optimizer view that storage, and each temporary
    # dies immediately instead of all new state being alive at the end.
    targets = [(d.storage_ph[f], n) for f, n in new_params]
    created = []
    for (f, k), n in new_states:
        if k in d.state_ph.get(f, {}):
            targets.append((d.state_ph[f][k], n))
        else:  # lazily created state (SGD momentum on its first step) is returned
            created.append(((f, k), n))
    for dst, src in targets:
        if _alias_root(src) is not dst:  # in-place updates already wrote the storage
            with d.graph.inserting_after(src):
                d.b.call(ATEN.copy_.default, dst, src, meta={"sw_kind": dst.meta["sw_kind"], "sw_role": "write_back"})
    for i, _ in enumerate(user):
        d.sig.outputs.append(("user", i, None))
    d.sig.outputs += [("opt_state", f, k) for (f, k), _ in created]
    d.graph.output(tuple(user + [n for _, n in created]))
    gm = torch.fx.GraphModule(torch.nn.Module(), d.graph)
    return gm, d.sig


def _list_writes(node) -> list[tuple[str, str]]:
    """``(kind, fqn)`` of every placeholder a list-mutating op (a fused optimizer kernel) writes."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return []
    out = []
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write or i >= len(node.args):
            continue
        if isinstance(node.args[i], (list, tuple)):
            out += [(n.meta.get("sw_kind"), n.meta.get("sw_fqn")) for n in node.args[i]
                    if isinstance(n, torch.fx.Node) and n.op == "placeholder"]
    return out


def _alias_root(node):
    """Follow in-place ops (``x.add_(...)`` returns ``x``) back to the mutated tensor."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and isinstance(
            node.target, torch._ops.OpOverload):
        args = node.target._schema.arguments
        if not (args and args[0].alias_info is not None and args[0].alias_info.is_write
                and isinstance(node.args[0], torch.fx.Node)):  # a fused optimizer writes lists: no single root
            break
        node = node.args[0]
    return node


def _safe(name: str) -> str:
    return name.replace(".", "_")


def _device(state) -> torch.device:
    return next(iter(state.storage.values())).device
