"""Provenance tags for graph nodes, stored in ``node.meta``.

Keys written:

* ``sw_kind``: ``param`` | ``buffer`` | ``input`` | ``grad`` | ``opt_state`` |
  ``hparam`` | ``activation`` | ``non_tensor``
* ``sw_fqn``: the parameter/buffer name for ``param``/``buffer``/``grad``
  (for ``grad`` the parameter it belongs to)
* ``sw_region``: ``forward`` or ``backward`` (joint graph only), recorded
  while tracing: a node is ``backward`` iff autograd created it.

The per-rank data-parallel graph adds ``agreement`` (the ranks' agreement bits, ``agreement.py``) to
``sw_kind``, and ``sw_writes`` (``[(kind, fqn), ...]``) on a fused optimizer kernel, which writes many
parameters and states at once.

Placeholders are tagged from the traced function's signature (we built the
argument lists, so we know which input is which) and gradients from the
output list, never from counts or batch-size matching.

Example::

    classify_joint(joint, backward_node_names)
    [n.meta["sw_kind"] for n in joint.gm.graph.nodes]
"""
from __future__ import annotations

from collections import Counter

import torch

__all__ = ["classify_joint", "kind_counts", "param_derived"]


def classify_joint(jg, backward_names: set[str]) -> None:
    """Tag every node of ``jg.gm`` (a :class:`~.tracing.JointGraph`)."""
    graph = jg.gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    roles = (
        [("param", n) for n in jg.param_names]
        + [("buffer", n) for n in jg.buffer_names]
        + [("input", None)] * jg.n_batch
    )
    assert len(roles) == len(placeholders), (len(roles), len(placeholders))
    for node, (kind, fqn) in zip(placeholders, roles):
        node.meta["sw_kind"], node.meta["sw_fqn"] = kind, fqn
    for node in graph.nodes:
        node.meta["sw_region"] = "backward" if node.name in backward_names else "forward"
        if node.op in ("placeholder", "output"):
            continue
        val = node.meta.get("val")
        node.meta["sw_kind"] = "activation" if isinstance(val, torch.Tensor) else "non_tensor"
        node.meta["sw_fqn"] = None
    outs = list(graph.output_node().args[0])
    for fqn, node in zip(jg.param_names, outs[jg.n_user_out:]):
        if node is not None:
            node.meta["sw_kind"], node.meta["sw_fqn"] = "grad", fqn


def kind_counts(gm: torch.fx.GraphModule) -> Counter:
    """Count nodes per ``sw_kind`` (useful in tests and summaries)."""
    return Counter(n.meta.get("sw_kind") for n in gm.graph.nodes if n.op != "output")


def param_derived(graph: torch.fx.Graph, root: torch.fx.Node) -> set[torch.fx.Node]:
    """Forward nodes computed from ``root`` alone (views, transposes, casts).

    These are recomputed from a fresh all-gather in the backward so that no
    gathered parameter stays alive between forward and backward.
    """
    derived = {root}
    for node in graph.nodes:
        if node.op != "call_function" or node.meta.get("sw_region") != "forward":
            continue
        ins = node.all_input_nodes
        if ins and all(i in derived for i in ins):
            derived.add(node)
    return derived
