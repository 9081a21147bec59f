"""Views: new metadata over the same blob, no data moved. Pure functions on TensorImpl."""

from __future__ import annotations

from ..errors import ShapeError
from ..ops.common import normalize_dim
from .meta import contiguous_strides, is_contiguous, numel

# views of global tensors (whose device is a placed layout) are taken part by part by the
# global interpreter (actorflow.parallel), which hands its function in here:
# fn(name, impl, *args) -> the view's TensorImpl
GLOBAL_VIEW: list = [None]


def infer_shape(op: str, shape, total: int) -> tuple:
    """Resolves one -1 in ``shape`` so that it holds ``total`` elements."""
    shape = tuple(int(s) for s in shape)
    neg = [i for i, s in enumerate(shape) if s == -1]
    if len(neg) > 1:
        raise ShapeError(f"{op}: only one dimension can be inferred (-1), got {shape}")
    if any(s < -1 for s in shape):
        raise ShapeError(f"{op}: invalid shape dimension in {shape}")
    if neg:
        rest = numel(tuple(s for s in shape if s != -1))
        if rest == 0 or total % rest:
            raise ShapeError(f"{op}: shape {shape} is invalid for input of size {total}")
        shape = shape[: neg[0]] + (total // rest,) + shape[neg[0] + 1 :]
    if numel(shape) != total:
        raise ShapeError(f"{op}: shape {shape} is invalid for input of size {total}")
    return shape


def view(impl, shape, op: str = "view"):
    """A view with a new shape; the tensor must be contiguous (else use reshape)."""
    m = impl.meta
    if m.device.placed:
        return GLOBAL_VIEW[0]("view", impl, shape, op)
    shape = infer_shape(op, shape, numel(m.shape))
    if not is_contiguous(m.shape, m.strides):
        raise ShapeError(
            f"{op}: view size is not compatible with input tensor's size and "
            f"stride (shape {m.shape}, strides {m.strides}); use .reshape(...) "
            f"or call .contiguous() first"
        )
    return impl.view(shape, contiguous_strides(shape), m.offset)


def permute(impl, dims):
    m = impl.meta
    if m.device.placed:
        return GLOBAL_VIEW[0]("permute", impl, dims)
    nd = len(m.shape)
    dims = tuple(normalize_dim("permute", d, nd) for d in dims)
    if len(dims) != nd or sorted(dims) != list(range(nd)):
        raise ShapeError(
            f"permute: dims {dims} must be a permutation of the {nd} dims of a "
            f"tensor of shape {m.shape}"
        )
    return impl.view(tuple(m.shape[d] for d in dims), tuple(m.strides[d] for d in dims), m.offset)


def transpose(impl, d0: int, d1: int):
    m = impl.meta
    nd = len(m.shape)
    if nd == 0:
        return impl.view((), (), m.offset)
    d0, d1 = normalize_dim("transpose", d0, nd), normalize_dim("transpose", d1, nd)
    order = list(range(nd))
    order[d0], order[d1] = order[d1], order[d0]
    return permute(impl, order)


def unsqueeze(impl, dim: int):
    m = impl.meta
    if m.device.placed:
        return GLOBAL_VIEW[0]("unsqueeze", impl, dim)
    dim = normalize_dim("unsqueeze", dim, len(m.shape) + 1)
    stride = m.strides[dim] * m.shape[dim] if dim < len(m.shape) else 1
    return impl.view(
        m.shape[:dim] + (1,) + m.shape[dim:],
        m.strides[:dim] + (stride,) + m.strides[dim:],
        m.offset,
    )


def squeeze(impl, dim=None):
    m = impl.meta
    if m.device.placed:
        return GLOBAL_VIEW[0]("squeeze", impl, dim)
    if dim is None:
        keep = [i for i, s in enumerate(m.shape) if s != 1]
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        dims = {normalize_dim("squeeze", d, len(m.shape)) for d in dims}
        keep = [i for i, s in enumerate(m.shape) if not (i in dims and s == 1)]
    return impl.view(tuple(m.shape[i] for i in keep), tuple(m.strides[i] for i in keep), m.offset)


def expand(impl, sizes):
    m = impl.meta
    if m.device.placed:
        return GLOBAL_VIEW[0]("expand", impl, sizes)
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < len(m.shape):
        raise ShapeError(
            f"expand: the number of sizes provided ({len(sizes)}) must be greater "
            f"or equal to the number of dimensions in the tensor ({len(m.shape)})"
        )
    if any(s < -1 for s in sizes):
        raise ShapeError(f"expand: sizes must be >= 0 or -1 (keep the size), got {sizes}")
    lead = len(sizes) - len(m.shape)
    shape, strides = [], []
    for i, s in enumerate(sizes):
        if i < lead:
            if s < 0:
                raise ShapeError(f"expand: -1 is not allowed in a leading, new dimension ({sizes})")
            shape.append(s)
            strides.append(0)
            continue
        cur, st = m.shape[i - lead], m.strides[i - lead]
        if s == -1 or s == cur:
            shape.append(cur)
            strides.append(st)
        elif cur == 1:
            shape.append(s)
            strides.append(0)
        else:
            raise ShapeError(
                f"expand: the expanded size of the tensor ({s}) must match the "
                f"existing size ({cur}) at non-singleton dimension {i}; target "
                f"sizes {sizes}, tensor shape {m.shape}"
            )
    return impl.view(tuple(shape), tuple(strides), m.offset)


def basic_index(impl, key: tuple):
    """x[key] for a key of ints, slices, None and Ellipsis (a view)."""
    m = impl.meta
    if m.device.placed:
        return GLOBAL_VIEW[0]("basic_index", impl, key)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > len(m.shape):
        raise IndexError(
            f"too many indices for tensor of dimension {len(m.shape)} (shape {m.shape}, key {key})"
        )
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    shape, strides, offset, d = [], [], m.offset, 0
    for k in key:
        if k is Ellipsis:
            for _ in range(len(m.shape) - n_real):
                shape.append(m.shape[d])
                strides.append(m.strides[d])
                d += 1
        elif k is None:
            shape.append(1)
            strides.append(0)
        elif isinstance(k, slice):
            start, stop, step = k.indices(m.shape[d])
            if step <= 0:
                raise ValueError(
                    f"step must be greater than zero, got {k.step}; flip the "
                    f"tensor instead of slicing it backwards"
                )
            length = max(0, (stop - start + step - 1) // step)
            offset += start * m.strides[d] if length else 0
            shape.append(length)
            strides.append(m.strides[d] * step)
            d += 1
        else:
            size = m.shape[d]
            i = int(k)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            offset += (i % size) * m.strides[d]
            d += 1
    shape += m.shape[d:]
    strides += m.strides[d:]
    return impl.view(tuple(shape), tuple(strides), offset)
