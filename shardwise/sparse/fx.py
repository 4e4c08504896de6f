"""torch.fx support for the sparse types.

The types use torch.fx's ``ProxyableClassMeta``: built from traced values inside a traced
``forward``, a ``KeyedJaggedTensor(...)`` becomes one graph node (a call of the class) instead of
running its validation on proxies; method calls on a traced KJT become ``call_method`` nodes. The
few helpers that take lists of sparse values (``KeyedJaggedTensor.concat``,
``KeyedTensor.regroup``) are ``torch.fx.wrap``-ed so they too are recorded as single calls.

An embedding collection's ``forward`` checks and loops over its input's keys, which a proxy does
not have, so ``symbolic_trace`` here keeps the collections as leaf modules (what TorchRec's tracer
does with its leaf_modules).

Example:
    >>> import torch
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
    >>> from shardwise.sparse import KeyedJaggedTensor, symbolic_trace
    >>> model = torch.nn.Sequential(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])]))
    >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    >>> gm = symbolic_trace(model)             # model's forward takes a KeyedJaggedTensor
    >>> [n.op for n in gm.graph.nodes]         # the collection is one leaf call
    ['placeholder', 'call_module', 'output']
    >>> torch.equal(gm(kjt).values(), model(kjt).values())   # same result as model(kjt)
    True
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch.fx import Proxy
from torch.fx._symbolic_trace import ProxyableClassMeta, is_fx_symbolic_tracing

__all__ = ["SparseMeta", "SparseTracer", "symbolic_trace"]


class SparseMeta(ProxyableClassMeta):
    """Metaclass of the sparse types: construction from proxies is recorded as one graph node."""

    def __call__(cls, *args, **kwargs):
        # ProxyableClassMeta's own __call__ asks is_fx_tracing(), which logs a warning in every
        # process that builds a KJT; the symbolic-tracing flag is the same test without it
        if not is_fx_symbolic_tracing():
            return type.__call__(cls, *args, **kwargs)
        proxies = []
        torch.fx.node.map_aggregate((args, kwargs), lambda a: proxies.append(a) if isinstance(a, Proxy) else None)
        if proxies:
            return proxies[0].tracer.create_proxy("call_function", cls, args, kwargs)
        return type.__call__(cls, *args, **kwargs)


def _default_leaf_types() -> tuple:
    # imported here: shardwise.embedding imports this package, not the other way round
    from .. import embedding
    names = ("EmbeddingBagCollection", "ShardedEmbeddingBagCollection", "EmbeddingCollection",
             "ShardedEmbeddingCollection")
    return tuple(getattr(embedding, n) for n in names if hasattr(embedding, n))


class SparseTracer(torch.fx.Tracer):
    """A Tracer that keeps embedding collections (and modules named in ``leaf_modules``) as leaves.

    Example:
        >>> inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> graph = SparseTracer(leaf_modules=["Sequential"]).trace(torch.nn.Sequential(inner))
        >>> [n.op for n in graph.nodes]      # inner, a type named in leaf_modules, is one call
        ['placeholder', 'call_module', 'output']
    """

    def __init__(self, leaf_modules: Optional[Sequence[str]] = None):
        super().__init__()
        self._leaf_names = set(leaf_modules or ())
        self._leaf_types = _default_leaf_types()

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if type(m).__name__ in self._leaf_names or isinstance(m, self._leaf_types):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def symbolic_trace(root: Union[torch.nn.Module, Callable[..., Any]], concrete_args: Optional[dict] = None,
                   leaf_modules: Optional[Sequence[str]] = None) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace`` with embedding collections kept as leaf modules.

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
        >>> from shardwise.sparse import KeyedJaggedTensor
        >>> model = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])])
        >>> gm = symbolic_trace(torch.nn.Sequential(model))    # torch.fx.symbolic_trace fails here
        >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
        >>> torch.equal(gm(kjt).values(), model(kjt).values())
        True
    """
    tracer = SparseTracer(leaf_modules)
    graph = tracer.trace(root, concrete_args)
    name = root.__class__.__name__ if isinstance(root, torch.nn.Module) else root.__name__
    return torch.fx.GraphModule(tracer.root, graph, name)
