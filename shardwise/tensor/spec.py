"""DTensorSpec: the global metadata of a distributed tensor, and the shard-layout arithmetic.

A spec is an immutable value (mesh, placements, global shape, stride, dtype) with a cached hash, so
it can be part of a sharding-propagation cache key. Local shard sizes follow ``torch.chunk``: a
dimension of size ``n`` split ``k`` ways has chunks of ``ceil(n / k)``; trailing ranks may be short or
empty. Several mesh dimensions sharding the same tensor dimension nest in mesh-dimension order.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh, _mesh_resources

from .placements import Partial, Placement, Replicate, Shard

__all__ = ["DTensorSpec", "chunk_range", "local_shape_and_offset", "normalize_placements", "mesh_coord", "match_layout"]


def chunk_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """(offset, length) of chunk ``index`` when ``size`` is split ``parts`` ways like torch.chunk."""
    chunk = -(-size // parts) if size else 0
    start = min(index * chunk, size)
    return start, min(chunk, size - start)


def local_shape_and_offset(
    shape: Sequence[int], mesh_shape: Sequence[int], coord: Sequence[int], placements: Sequence[Placement]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Local shard shape and its offset in the global tensor for the rank at mesh ``coord``."""
    local = list(shape)
    offset = [0] * len(shape)
    for mdim, p in enumerate(placements):
        if type(p) is Shard:
            start, length = chunk_range(local[p.dim], mesh_shape[mdim], coord[mdim])
            offset[p.dim] += start
            local[p.dim] = length
    return tuple(local), tuple(offset)


def mesh_coord(mesh: DeviceMesh) -> tuple[int, ...]:
    coord = mesh.get_coordinate()
    if coord is None:
        raise ValueError(f"this rank is not part of {mesh}; run the op on the mesh's ranks only")
    return tuple(coord)


def coord_or_none(mesh: DeviceMesh):
    """This rank's mesh coordinate, or None on a rank outside the mesh (which holds empty local tensors
    and runs no collective, as in PyTorch)."""
    coord = mesh.get_coordinate()
    return None if coord is None else tuple(coord)


def mesh_or_current(mesh, what: str) -> DeviceMesh:
    """``mesh``, or the one of the innermost ``with mesh:`` block: DeviceMesh.__enter__ pushes onto
    PyTorch's per-thread mesh stack, which its distribute_tensor/from_local read the same way."""
    if mesh is not None:
        return mesh
    stack = _mesh_resources.mesh_stack
    if not stack:
        raise ValueError(f"{what}: device_mesh=None and no `with mesh:` block is active in this thread; pass "
                         "device_mesh=mesh or call it inside `with mesh:`")
    return stack[-1]


def normalize_placements(placements, mesh_ndim: int, tensor_ndim: int) -> tuple[Placement, ...]:
    """Validate placements against the mesh and tensor; return them with non-negative Shard dims."""
    if isinstance(placements, Placement):
        placements = (placements,)
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise ValueError(
            f"placements {tuple(str(p) for p in placements)} has {len(placements)} entries but the mesh "
            f"has {mesh_ndim} dimension(s): give exactly one placement per mesh dimension"
        )
    out = []
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"placement {p!r} is not a Placement; use Shard(d), Replicate() or Partial()")
        if type(p) is Shard:
            if not -tensor_ndim <= p.dim < tensor_ndim or tensor_ndim == 0:
                lo, hi = -tensor_ndim, tensor_ndim - 1
                fix = f"dim must be in [{lo}, {hi}]" if tensor_ndim else "a 0-d tensor cannot be sharded"
                raise ValueError(f"{p} on a {tensor_ndim}-D tensor: {fix}; use Replicate() or a valid Shard")
            if p.dim < 0:
                p = Shard(p.dim + tensor_ndim)
        out.append(p)
    return tuple(out)


class DTensorSpec:
    """Immutable global description of a DTensor; equal specs hash equal.

    >>> from shardwise.tensor import init_device_mesh
    >>> spec = DTensorSpec(init_device_mesh("cpu", (1,)), (Shard(0),), torch.Size([4, 4]), (4, 1), torch.float32)
    >>> spec
    Spec(S(0) | (4, 4) float32)
    """

    __slots__ = ("mesh", "placements", "shape", "stride", "dtype", "_hash")

    def __init__(self, mesh: DeviceMesh, placements, shape, stride, dtype: torch.dtype):
        self.mesh = mesh
        self.placements = tuple(placements)
        self.shape = torch.Size(shape)
        self.stride = tuple(stride)
        self.dtype = dtype
        self._hash = hash((id(mesh), self.placements, tuple(self.shape), self.stride, dtype))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        return (
            type(other) is DTensorSpec
            and self._hash == other._hash
            and self.mesh is other.mesh
            and self.placements == other.placements
            and self.shape == other.shape
            and self.stride == other.stride
            and self.dtype == other.dtype
        )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def tensor_meta(self) -> "DTensorSpec":
        # read by the C++ DTensor constructor (callpath/wrapping.py) for .shape and .stride, which a
        # spec holds itself
        return self

    def with_placements(self, placements) -> "DTensorSpec":
        return DTensorSpec(self.mesh, placements, self.shape, self.stride, self.dtype)

    def local_shape(self, coord: Sequence[int]) -> tuple[int, ...]:
        return local_shape_and_offset(self.shape, self.mesh.shape, coord, self.placements)[0]

    def local_offset(self, coord: Sequence[int]) -> tuple[int, ...]:
        return local_shape_and_offset(self.shape, self.mesh.shape, coord, self.placements)[1]

    def is_replicated(self) -> bool:
        return all(type(p) is Replicate for p in self.placements)

    def has_partial(self) -> bool:
        return any(isinstance(p, Partial) for p in self.placements)

    def __repr__(self) -> str:
        pl = ", ".join(str(p) for p in self.placements)
        return f"Spec({pl} | {tuple(self.shape)} {str(self.dtype).replace('torch.', '')})"


def _global_stride(local: torch.Tensor, mesh, placements, shape) -> tuple[int, ...]:
    """The global stride a local piece implies: contiguous pieces make a contiguous tensor; otherwise
    (a transposed piece, say) each Shard(d) scales the strides that step over dim d, as PyTorch's
    from_local does, so ``.contiguous()`` on the DTensor really reorders and ``.view`` works after."""
    if local.is_contiguous():
        return _contiguous_stride(shape)
    stride = list(local.stride())
    for mdim, p in enumerate(placements):
        if type(p) is Shard:
            n = mesh.size(mdim)
            stride = [st * n if i != p.dim and st >= local.stride(p.dim) else st for i, st in enumerate(stride)]
    return tuple(stride)


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def match_layout(local: torch.Tensor, stride) -> torch.Tensor:
    """``local`` with its dims in memory in the order the global ``stride`` gives them (a copy only when
    the orders differ). A collective returns a contiguous buffer; a DTensor whose global stride says
    "transposed" over such a piece would decide view-versus-copy (``reshape``, autograd's layout
    checks) on strides its local tensor does not have, and the local ``view`` would fail.

    >>> t = torch.arange(6.0).view(2, 3)
    >>> match_layout(t, (1, 2)).stride(), match_layout(t, (3, 1)) is t
    ((1, 2), True)
    """
    n = len(stride)
    if n < 2 or 0 in stride or all(stride[i] >= stride[i + 1] for i in range(n - 1)):
        return local  # in order already, or an expanded (stride 0) view no local piece can copy
    order = sorted(range(n), key=lambda d: -stride[d])  # outermost first; stable for size-1 ties
    inner = local.permute(order)
    if inner.is_contiguous():
        return local
    inverse = [0] * n
    for pos, d in enumerate(order):
        inverse[d] = pos
    return inner.contiguous().permute(inverse)
