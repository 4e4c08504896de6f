"""The ``*_copy`` forms of view ops (``view_copy``, ``permute_copy``, ``diagonal_copy``, ...): each takes
its view's rule. Derived from the registry, so a view that gains a rule gives its copy one too; import
this module after every other op family."""

from __future__ import annotations

from torch.ops import aten

from ..propagation.registry import RULES

__all__ = ["copy_forms"]


def copy_forms() -> dict:
    """{copy overload: the view overload whose rule it takes} for every registered view with a copy."""
    found = {}
    for view in list(RULES):
        packet = getattr(aten, view.overloadpacket.__name__ + "_copy", None)
        copy = getattr(packet, view._overloadname, None) if packet is not None else None
        if copy is not None and copy not in RULES:
            found[copy] = view
    return found


def _register() -> None:
    for copy, view in copy_forms().items():
        RULES[copy] = RULES[view]


_register()
