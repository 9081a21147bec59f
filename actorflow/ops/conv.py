"""Convolution and pooling over NCHW tensors: conv2d, its transpose (conv2d's input
gradient) and its weight gradient, unfold/fold, max_pool2d (with PyTorch's flat indices per
plane), avg_pool2d, adaptive_avg_pool2d, and the pools' backward ops.

Attrs are normalised by the caller (``functional/conv.py``): ``kernel``, ``stride`` and
``dilation`` are (h, w) pairs; ``padding`` is (top, bottom, left, right), so 'same' with an
even kernel (PyTorch pads its extra row and column at the bottom and right) is one op.

The CPU path of conv2d is im2col + one batched matmul: the padded input's windows are a
strided view (N, C, kh, kw, oh, ow); one copy lays them out as (N, C*kh*kw, oh*ow) and
``np.matmul`` of the weight (groups, O/groups, C/groups*kh*kw) with it writes the output
(N, groups, O/groups, oh*ow), which is NCHW as it is: no transpose after. Measured (one
thread, float32) on the digits CNN's shapes (batch 64-256, 1->16 channels on 8x8, 16->32
on 4x4) and on 64->64 channels on 32x32, against a flat (C*kh*kw, N*oh*ow) gemm with one
transpose of the output after, per-kernel-offset accumulation (kh*kw matmuls, no big
buffer) and ``np.einsum``: on the CNN's shapes the batched form was fastest or tied, 5x
faster than the others for 1->16 channels at batch 256, and per-offset accumulation 3-30x
slower (kh*kw strided copies and small gemms); at 32x32 with 64 channels all four were
within the machine's noise of each other (180-240 ms). numpy's cost on
small planes is per inner run of a copy or an add, not per element, so where the rows are
shorter than ``SHORT_ROW_*`` and the batch longer, im2col, the weight gradient and col2im
put the batch innermost (the 16->32 layer on 4x4: 1.5-1.7x). Against PyTorch's oneDNN on
the same run: 0.4 ms vs 0.7 ms for 1->16 at batch 256, 1.0 vs 0.3 ms for 16->32, and 94
vs 33-53 ms at 32x32 with 64 channels (forward). The transpose (conv2d's input gradient)
is the same matmul the other way and a col2im: kh*kw strided adds into the padded output,
the adds fold and avg_pool2d's backward make too.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..dtype import FLOAT, int64
from ..errors import DTypeError, ShapeError
from .registry import OpDef, register

# -- shapes --------------------------------------------------------------------------------


def conv_out(n: int, k: int, s: int, p0: int, p1: int, d: int) -> int:
    """A convolution's output length along one dim (may be <= 0: the caller refuses it)."""
    return (n + p0 + p1 - d * (k - 1) - 1) // s + 1


def pool_out(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """A pool's output length along one dim, as PyTorch's ``pooling_output_shape``: with
    ceil_mode the last window may start past the input's end only if it starts inside the
    left padding or the input."""
    span = n + 2 * p - d * (k - 1) - 1 + ((s - 1) if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _float_input(op, m, what="input"):
    if m.dtype.category != FLOAT:
        raise DTypeError(
            f"{op}: needs a floating point {what}, got {m.dtype}; convert with .float() first"
        )


def _needs_4d(op, m, what="input"):
    if len(m.shape) != 4:
        raise ShapeError(f"{op}: expected a 4-D {what} (N, C, H, W), got shape {m.shape}")


# -- windows, im2col and col2im --------------------------------------------------------------


def padded(x, pads, value=0.0):
    """``x`` (N, C, H, W) with ``pads`` (top, bottom, left, right) rows and columns of
    ``value`` around it (``x`` itself when there are none)."""
    pt, pb, pl, pr = pads
    if not (pt or pb or pl or pr):
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + pt + pb, w + pl + pr), value, dtype=x.dtype)
    out[:, :, pt : pt + h, pl : pl + w] = x
    return out


def windows(xp, kernel, stride, dilation, out_hw):
    """The read-only strided view (N, C, kh, kw, oh, ow) of ``xp``'s windows."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    sn, sc, sy, sx = xp.strides
    return as_strided(
        xp,
        xp.shape[:2] + (kh, kw, oh, ow),
        (sn, sc, sy * dh, sx * dw, sy * sh, sx * sw),
        writeable=False,
    )


def im2col(x, kernel, stride, pads, dilation, out_hw):
    """(N, C*kh*kw, oh*ow): each output position's window as a column (one copy; none for a
    1x1 kernel at stride 1 without padding)."""
    n, c = x.shape[:2]
    v = windows(padded(x, pads), kernel, stride, dilation, out_hw)
    return v.reshape(n, c * kernel[0] * kernel[1], out_hw[0] * out_hw[1])


# Rows shorter than these run with the batch as the innermost dim (when the batch is longer):
# numpy's cost on small planes is per inner run, not per element. Measured on 4x4 and 8x8
# planes (the digits CNN's) against 32x32 ones.
SHORT_ROW_IM2COL = 8
SHORT_ROW_COL2IM = 16


def batch_last(n: int, ow: int, short: int) -> bool:
    return ow < short and n > ow


def im2col_batch_last(x, kernel, stride, pads, dilation, out_hw):
    """(C*kh*kw, oh*ow*N): ``im2col`` with the batch innermost (one transposing copy into
    the padded (C, H, W, N) plane, one copy of the windows with runs of N)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    pt, pb, pl, pr = pads
    xp = np.zeros((c, h + pt + pb, w + pl + pr, n), dtype=x.dtype)
    xp[:, pt : pt + h, pl : pl + w] = x.transpose(1, 2, 3, 0)
    sc, sy, sx, sn = xp.strides
    v = as_strided(
        xp, (c, kh, kw, oh, ow, n), (sc, sy * dh, sx * dw, sy * sh, sx * sw, sn), writeable=False
    )
    return v.reshape(c * kh * kw, oh * ow * n)


def col2im_into(out, cols, stride, pads, dilation):
    """Adds each window of ``cols`` (C, kh, kw, oh, ow, N: any strides, broadcasting
    allowed) at its place in the padded plane and writes the part inside ``pads`` to
    ``out`` (N, C, H, W): the adjoint of ``im2col``."""
    c, kh, kw, oh, ow, n = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    pt, pb, pl, pr = pads
    h, w = out.shape[2:]
    hb = max((oh - 1) * sh + dh * (kh - 1) + 1, pt + h)
    wb = max((ow - 1) * sw + dw * (kw - 1) + 1, pl + w)
    acc = np.float32 if out.dtype == np.float16 else out.dtype
    if batch_last(n, ow, SHORT_ROW_COL2IM):
        plane = np.zeros((c, hb, wb, n), dtype=acc)
    else:  # (N, C, H, W) memory, indexed as (C, H, W, N)
        plane = np.zeros((n, c, hb, wb), dtype=acc).transpose(1, 2, 3, 0)
    for i in range(kh):
        ys = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
        for j in range(kw):
            plane[:, ys, j * dw : j * dw + (ow - 1) * sw + 1 : sw] += cols[:, i, j]
    np.copyto(out, plane[:, pt : pt + h, pl : pl + w].transpose(3, 0, 1, 2), casting="unsafe")


def _into(out, shape):
    """``out`` seen as ``shape`` when that is a view (contiguous), else None."""
    if out.flags.c_contiguous:
        return out.reshape(shape)
    return None


def _matmul_into(out, shape, a, b):
    o = _into(out, shape)
    if o is not None:
        np.matmul(a, b, out=o)
    else:
        out[...] = np.matmul(a, b).reshape(out.shape)


# -- conv2d, its input gradient (conv_transpose2d) and its weight gradient -------------------


def _conv_attrs(a):
    return a["stride"], a["padding"], a["dilation"], a["groups"]


def _conv_operands(op: str, x, w) -> None:
    """An input and a weight a convolution takes: floating point, 4-D, one dtype."""
    _float_input(op, x)
    _needs_4d(op, x)
    _needs_4d(op, w, "weight")
    if w.dtype is not x.dtype:
        raise DTypeError(
            f"{op}: the input ({x.dtype}) and the weight ({w.dtype}) must have "
            f"the same dtype; convert one with .to(dtype)"
        )


def _conv2d_infer(metas, attrs):
    x, w = metas
    _conv_operands("conv2d", x, w)
    (sh, sw), (pt, pb, pl, pr), (dh, dw), g = _conv_attrs(attrs)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c != cg * g or o % g:
        raise ShapeError(
            f"conv2d: the input has {c} channels (shape {x.shape}) but the weight "
            f"{w.shape} with groups={g} expects {cg * g} (weight.shape[1] * groups)"
            + (f"; and out_channels {o} is not divisible by groups={g}" if o % g else "")
            + "; make the input's channels equal in_channels"
        )
    oh, ow = conv_out(h, kh, sh, pt, pb, dh), conv_out(wd, kw, sw, pl, pr, dw)
    if oh <= 0 or ow <= 0:
        raise ShapeError(
            f"conv2d: the kernel ({kh}x{kw}, dilation ({dh}, {dw})) is larger "
            f"than the padded input ({h + pt + pb}x{wd + pl + pr}, input shape "
            f"{x.shape}, padding {attrs['padding']}); pad more or use a smaller "
            f"kernel"
        )
    return [((n, o, oh, ow), x.dtype)]


def _k_conv2d(outs, ins, attrs):
    x, w = ins
    out = outs[0]
    stride, pads, dilation, g = _conv_attrs(attrs)
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    oh, ow = out.shape[2:]
    k = cg * kh * kw
    if batch_last(n, ow, SHORT_ROW_IM2COL):
        cols = im2col_batch_last(x, (kh, kw), stride, pads, dilation, (oh, ow))
        y = np.matmul(w.reshape(g, o // g, k), cols.reshape(g, k, oh * ow * n))
        np.copyto(out, y.reshape(o, oh, ow, n).transpose(3, 0, 1, 2))
        return
    cols = im2col(x, (kh, kw), stride, pads, dilation, (oh, ow))
    _matmul_into(
        out, (n, g, o // g, oh * ow), w.reshape(g, o // g, k), cols.reshape(n, g, k, oh * ow)
    )


def _conv_transpose2d_infer(metas, attrs):
    x, w = metas
    _conv_operands("conv_transpose2d", x, w)
    (sh, sw), (pt, pb, pl, pr), (dh, dw), g = _conv_attrs(attrs)
    n, c, h, wd = x.shape
    ci, og, kh, kw = w.shape
    if c != ci or ci % g:
        raise ShapeError(
            f"conv_transpose2d: the input has {c} channels (shape {x.shape}) but "
            f"the weight {w.shape} with groups={g} expects {ci} (weight.shape[0], "
            f"divisible by groups); make the input's channels equal in_channels"
        )
    oh, ow = attrs["output_size"]
    # the windows reach lo; output_padding adds rows past them (zeros) up to
    # max(stride, dilation) - 1 (then the output can convolve back to more than the input)
    loh = (h - 1) * sh - pt - pb + dh * (kh - 1) + 1
    low = (wd - 1) * sw - pl - pr + dw * (kw - 1) + 1
    if oh <= 0 or ow <= 0 or not 0 <= oh - loh < max(sh, dh) or not 0 <= ow - low < max(sw, dw):
        raise ShapeError(
            f"conv_transpose2d: an output of {oh}x{ow} is not one the input's "
            f"{h}x{wd} transposes to (input shape {x.shape}, weight {w.shape}, "
            f"stride {attrs['stride']}, padding {attrs['padding']}, dilation "
            f"{attrs['dilation']}): it must be {loh}x{low} plus an output_padding "
            f"smaller than stride or dilation, and more than 0"
        )
    return [((n, og * g, oh, ow), x.dtype)]


def _k_conv_transpose2d(outs, ins, attrs):
    x, w = ins
    out = outs[0]
    stride, pads, dilation, g = _conv_attrs(attrs)
    n, ci, h, wd = x.shape
    _, og, kh, kw = w.shape
    k = og * kh * kw
    wt = w.reshape(g, ci // g, k).transpose(0, 2, 1)  # (g, k, ci/g)
    if batch_last(n, wd, SHORT_ROW_IM2COL):
        xt = x.transpose(1, 2, 3, 0).reshape(g, ci // g, h * wd * n)  # (a copy)
        cols = np.matmul(wt, np.ascontiguousarray(xt))  # (g, k, h*w*n)
        cols = cols.reshape(g * og, kh, kw, h, wd, n)
    else:
        x = np.ascontiguousarray(x)  # (a broadcast gradient: BLAS needs real strides)
        cols = np.matmul(wt, x.reshape(n, g, ci // g, h * wd))  # (n, g, k, h*w)
        cols = cols.reshape(n, g * og, kh, kw, h, wd).transpose(1, 2, 3, 4, 5, 0)
    col2im_into(out, cols, stride, pads, dilation)


def _conv2d_weight_infer(metas, attrs):
    x, gy = metas
    (kh, kw), g = attrs["kernel"], attrs["groups"]
    return [((gy.shape[1], x.shape[1] // g, kh, kw), x.dtype)]


def _k_conv2d_weight(outs, ins, attrs):
    """dL/dweight of conv2d: for each group, gy (O/g, N*L) @ cols (N*L, C/g*kh*kw)."""
    x, gy = ins
    out = outs[0]
    stride, pads, dilation, g = _conv_attrs(attrs)
    kernel = attrs["kernel"]
    gy = np.ascontiguousarray(gy)  # (a broadcast gradient: BLAS needs real strides)
    n, c = x.shape[:2]
    o, oh, ow = gy.shape[1:]
    k = c // g * kernel[0] * kernel[1]
    if batch_last(n, ow, SHORT_ROW_IM2COL):
        cols = im2col_batch_last(x, kernel, stride, pads, dilation, (oh, ow))
        cols = cols.reshape(g, k, oh * ow * n)
        a = gy.transpose(1, 2, 3, 0).reshape(g, o // g, oh * ow * n)
    else:
        v = windows(padded(x, pads), kernel, stride, dilation, (oh, ow))
        cols = v.transpose(1, 2, 3, 0, 4, 5).reshape(g, k, n * oh * ow)
        a = gy.reshape(n, g, o // g, oh * ow).transpose(1, 2, 0, 3).reshape(g, o // g, n * oh * ow)
    if a.dtype != out.dtype:
        a = a.astype(out.dtype)
    if k <= o // g:
        _matmul_into(out, (g, o // g, k), a, cols.transpose(0, 2, 1))
        return
    # more weights per output channel than channels: cols (g, k, L) @ a^T (g, L, o/g),
    # transposed into out, which OpenBLAS runs ~15-25% faster than a @ cols^T (measured
    # float32 64x1024 @ 1024x288 and 32x8192 @ 8192x144; slower for 32x4096 @ 4096x9)
    wt = np.matmul(cols, a.transpose(0, 2, 1)).transpose(0, 2, 1)
    o3 = _into(out, (g, o // g, k))
    if o3 is not None:
        np.copyto(o3, wt)
    else:
        out[...] = wt.reshape(out.shape)


register(
    OpDef(
        "conv2d",
        ("x", "weight"),
        _conv2d_infer,
        {"cpu": _k_conv2d},
        attrs=("stride", "padding", "dilation", "groups"),
        host_only=True,
    )
)
register(
    OpDef(
        "conv_transpose2d",
        ("x", "weight"),
        _conv_transpose2d_infer,
        {"cpu": _k_conv_transpose2d},
        attrs=("stride", "padding", "dilation", "groups", "output_size"),
        host_only=True,
    )
)
register(
    OpDef(
        "conv2d_weight",
        ("x", "grad"),
        _conv2d_weight_infer,
        {"cpu": _k_conv2d_weight},
        attrs=("stride", "padding", "dilation", "groups", "kernel"),
        host_only=True,
    )
)

# (host_only, every op here: their kernels view windows with numpy's as_strided, which
# needs host memory; a CUDA device runs them on host copies)

# -- unfold / fold (im2col and col2im as ops) ------------------------------------------------


def _unfold_infer(metas, attrs):
    x = metas[0]
    _needs_4d("unfold", x)
    (kh, kw), (sh, sw), pads, (dh, dw) = (
        attrs["kernel"],
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
    )
    n, c, h, w = x.shape
    oh, ow = conv_out(h, kh, sh, pads[0], pads[1], dh), conv_out(w, kw, sw, pads[2], pads[3], dw)
    if oh <= 0 or ow <= 0:
        raise ShapeError(
            f"unfold: the kernel ({kh}x{kw}, dilation ({dh}, {dw})) is larger "
            f"than the padded input (input shape {x.shape}, padding "
            f"{pads[0]}x{pads[2]}); pad more or use a smaller kernel"
        )
    return [((n, c * kh * kw, oh * ow), x.dtype)]


def _k_unfold(outs, ins, attrs):
    x = ins[0]
    (kh, kw), (sh, sw), pads, (dh, dw) = (
        attrs["kernel"],
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
    )
    h, w = x.shape[2:]
    out_hw = (conv_out(h, kh, sh, pads[0], pads[1], dh), conv_out(w, kw, sw, pads[2], pads[3], dw))
    outs[0][...] = im2col(x, (kh, kw), (sh, sw), pads, (dh, dw), out_hw)


def fold_blocks(op, shape, attrs):
    """(C, oh, ow) of fold's input (N, C*kh*kw, L) for output_size (H, W); ShapeError when L
    is not the count of blocks or the channels do not divide."""
    (h, w), (kh, kw), (sh, sw), pads, (dh, dw) = (
        attrs["output_size"],
        attrs["kernel"],
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
    )
    oh, ow = conv_out(h, kh, sh, pads[0], pads[1], dh), conv_out(w, kw, sw, pads[2], pads[3], dw)
    if len(shape) != 3 or shape[1] % (kh * kw) or oh <= 0 or ow <= 0 or shape[2] != oh * ow:
        raise ShapeError(
            f"{op}: expected an input (N, C*{kh}*{kw}, {max(oh, 0) * max(ow, 0)}) "
            f"for output_size {(h, w)}, kernel_size {(kh, kw)}, stride "
            f"{(sh, sw)}, padding {(pads[0], pads[2])}, dilation {(dh, dw)}; got "
            f"shape {shape}"
        )
    return shape[1] // (kh * kw), oh, ow


def _fold_infer(metas, attrs):
    x = metas[0]
    c, _, _ = fold_blocks("fold", x.shape, attrs)
    return [((x.shape[0], c) + tuple(attrs["output_size"]), x.dtype)]


def _k_fold(outs, ins, attrs):
    x = ins[0]
    out = outs[0]
    kh, kw = attrs["kernel"]
    c, oh, ow = fold_blocks("fold", x.shape, attrs)
    col2im_into(
        out,
        x.reshape(x.shape[0], c, kh, kw, oh, ow).transpose(1, 2, 3, 4, 5, 0),
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
    )


register(
    OpDef(
        "unfold",
        ("x",),
        _unfold_infer,
        {"cpu": _k_unfold},
        attrs=("kernel", "stride", "padding", "dilation"),
        host_only=True,
    )
)
register(
    OpDef(
        "fold",
        ("x",),
        _fold_infer,
        {"cpu": _k_fold},
        attrs=("output_size", "kernel", "stride", "padding", "dilation"),
        host_only=True,
    )
)

# -- pools -----------------------------------------------------------------------------------


def _pool_hw(attrs, hw):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (
        attrs["kernel"],
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
    )
    ceil = attrs["ceil_mode"]
    return pool_out(hw[0], kh, sh, ph, dh, ceil), pool_out(hw[1], kw, sw, pw, dw, ceil)


def _pool_pads(attrs, hw, out_hw):
    """(top, bottom, left, right): the padding, and the rows and columns past it the last
    window of ceil_mode reads (the kernel treats them as padding)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (
        attrs["kernel"],
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
    )
    bottom = max(ph, (out_hw[0] - 1) * sh + dh * (kh - 1) + 1 - hw[0] - ph)
    right = max(pw, (out_hw[1] - 1) * sw + dw * (kw - 1) + 1 - hw[1] - pw)
    return ph, bottom, pw, right


def _pool_infer(op):
    def infer(metas, attrs):
        x = metas[0]
        _float_input(op, x)
        _needs_4d(op, x)
        (kh, kw), (ph, pw), (dh, dw) = attrs["kernel"], attrs["padding"], attrs["dilation"]
        if ph > (dh * (kh - 1) + 1) // 2 or pw > (dw * (kw - 1) + 1) // 2:
            raise ShapeError(
                f"{op}: padding {(ph, pw)} must be at most half of the "
                f"(dilated) kernel size {(kh, kw)}"
            )
        oh, ow = _pool_hw(attrs, x.shape[2:])
        if oh <= 0 or ow <= 0:
            raise ShapeError(
                f"{op}: the kernel {(kh, kw)} is larger than the padded input "
                f"(input shape {x.shape}, padding {(ph, pw)}); pad more or use "
                f"a smaller kernel_size"
            )
        shape = x.shape[:2] + (oh, ow)
        return [(shape, x.dtype), (shape, int64)] if op == "max_pool2d" else [(shape, x.dtype)]

    return infer


# Output rows shorter than this read each offset's slice once into a contiguous block
# (measured 2x2/2 pools of 8x8 and 4x4 planes, batch 128: ~2x faster).
SHORT_ROW_POOL = 16


def _first_max(slices, vals, arg, rows, cols, kw, dilation, hw):
    """The maxima of ``slices`` into ``vals`` (a NaN propagates) and into ``arg`` the first
    offset holding each, where some offsets read padding (a -inf maximum is a real
    position's, never the padding's, as PyTorch's); True when some maximum is NaN."""
    (dh, dw), (h, w) = dilation, hw
    np.copyto(vals, slices[0])
    for s in slices[1:]:
        np.maximum(vals, s, out=vals)
    found = np.zeros(vals.shape, dtype=bool)
    hit = np.empty(vals.shape, dtype=bool)
    for k, s in enumerate(slices):
        np.equal(s, vals, out=hit)
        r, q = rows + (k // kw) * dh, cols + (k % kw) * dw
        if r.min() < 0 or r.max() >= h or q.min() < 0 or q.max() >= w:
            hit &= ((r >= 0) & (r < h))[:, None] & ((q >= 0) & (q < w))[None, :]
        hit &= ~found
        found |= hit
        if k:
            arg += hit * arg.dtype.type(k)
    return not found.all()


def _k_max_pool2d(outs, ins, attrs):
    """One pass per kernel offset over the strided slice of the padded input it sees (no
    window copy: numpy's argmax over short windows costs more than the passes): the maxima
    (a NaN propagates) and the first offset holding each maximum (without padding, in the
    same pass: the offset taking over where it is strictly greater), and where the maximum
    is NaN the last NaN's offset, as PyTorch's CPU kernel picks them."""
    x = ins[0]
    vals, idx = outs
    n, c, h, w = x.shape
    oh, ow = vals.shape[2:]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (
        attrs["kernel"],
        attrs["stride"],
        attrs["padding"],
        attrs["dilation"],
    )
    pads = _pool_pads(attrs, (h, w), (oh, ow))
    xp = padded(x, pads, -np.inf)
    slices = [
        xp[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]
    if ow < SHORT_ROW_POOL:
        # short strided rows: numpy pays per row, so each offset's slice is copied once
        # into a contiguous block and every later pass runs flat
        win = np.empty((len(slices),) + vals.shape, dtype=x.dtype)
        for k, s in enumerate(slices):
            win[k] = s
        slices = list(win)
    arg = np.zeros(vals.shape, dtype=np.uint8 if len(slices) < 256 else np.int64)
    rows, cols = np.arange(oh) * sh - ph, np.arange(ow) * sw - pw
    if not any(pads):
        # every offset a real position: a running max, an offset taking over only where it
        # is strictly greater (the first offset holding each maximum; a NaN never compares
        # greater, so NaN maxima are fixed below). Offsets come in increasing order, so
        # taking over is max(arg, hit * k) (a masked copy costs ~40x more: random masks)
        np.copyto(vals, slices[0])
        hit = np.empty(vals.shape, dtype=bool)
        took = np.empty(vals.shape, dtype=arg.dtype)
        for k, s in enumerate(slices[1:], 1):
            np.greater(s, vals, out=hit)
            np.multiply(hit, arg.dtype.type(k), out=took)
            np.maximum(arg, took, out=arg)
            np.maximum(vals, s, out=vals)
        nan = np.isnan(vals).any()
    else:
        nan = _first_max(slices, vals, arg, rows, cols, kw, (dh, dw), (h, w))
    if nan:  # NaN maxima: the last NaN
        for k, s in enumerate(slices):
            np.copyto(arg, k, where=np.isnan(s), casting="unsafe")
    k = np.arange(len(slices))  # offset k's flat shift, then the window's
    shifts = (k // kw * dh) * w + k % kw * dw
    if idx.dtype == np.intp and idx.flags.c_contiguous:
        # the offsets widened in place, then looked up in place (no temporaries)
        np.copyto(idx, arg, casting="unsafe")
        np.take(shifts, idx, out=idx)
    else:
        np.copyto(idx, np.take(shifts, arg), casting="unsafe")
    idx += rows[:, None] * w + cols


def _max_pool2d_backward_infer(metas, attrs):
    g, idx = metas
    return [(g.shape[:2] + tuple(attrs["input_hw"]), g.dtype)]


def _k_max_pool2d_backward(outs, ins, attrs):
    """The gradient added at each window's picked position (flat per plane), planes apart."""
    g, idx = ins
    out = outs[0]
    n, c = g.shape[:2]
    hw = out.shape[2] * out.shape[3]
    planes = (np.arange(n * c, dtype=np.int64) * hw)[:, None]
    flat = (idx.reshape(n * c, idx.shape[2] * idx.shape[3]) + planes).ravel()  # (no -1: empty)
    got = np.bincount(flat, weights=g.reshape(-1), minlength=n * c * hw)
    np.copyto(out, got.reshape(out.shape), casting="unsafe")


def _avg_divisor(attrs, hw, out_hw, dtype):
    """(oh, ow): each window's divisor as PyTorch's avg_pool2d counts it."""
    override = attrs["divisor_override"]
    if override:
        return dtype.type(override)
    per = []
    for k, s, p, n, o in zip(
        attrs["kernel"], attrs["stride"], attrs["padding"], hw, out_hw, strict=True
    ):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        pool = end - start
        real = np.minimum(end, n) - np.maximum(start, 0)
        per.append(pool if attrs["count_include_pad"] else real)
    return (per[0][:, None] * per[1][None, :]).astype(dtype)


def _k_avg_pool2d(outs, ins, attrs):
    x = ins[0]
    out = outs[0]
    h, w = x.shape[2:]
    oh, ow = out.shape[2:]
    (kh, kw), (sh, sw) = attrs["kernel"], attrs["stride"]
    acc = np.float32 if x.dtype == np.float16 else x.dtype
    xp = padded(x.astype(acc, copy=False), _pool_pads(attrs, (h, w), (oh, ow)))
    total = np.zeros(out.shape, dtype=acc)
    for i in range(kh):
        for j in range(kw):
            total += xp[:, :, i : i + (oh - 1) * sh + 1 : sh, j : j + (ow - 1) * sw + 1 : sw]
    np.divide(
        total, _avg_divisor(attrs, (h, w), (oh, ow), np.dtype(acc)), out=out, casting="unsafe"
    )


def _avg_backward_infer(metas, attrs):
    g = metas[0]
    return [(g.shape[:2] + tuple(attrs["input_hw"]), g.dtype)]


def _k_avg_pool2d_backward(outs, ins, attrs):
    g = ins[0]
    out = outs[0]
    hw = out.shape[2:]
    oh, ow = g.shape[2:]
    acc = np.float32 if g.dtype == np.float16 else g.dtype
    share = g.astype(acc, copy=False) / _avg_divisor(attrs, hw, (oh, ow), np.dtype(acc))
    n, c = g.shape[:2]
    kh, kw = attrs["kernel"]
    cols = np.broadcast_to(share.transpose(1, 2, 3, 0)[:, None, None], (c, kh, kw, oh, ow, n))
    col2im_into(out, cols, attrs["stride"], _pool_pads(attrs, hw, (oh, ow)), (1, 1))


_POOL = ("kernel", "stride", "padding", "dilation", "ceil_mode")
_AVG = (
    "kernel",
    "stride",
    "padding",
    "dilation",
    "ceil_mode",
    "count_include_pad",
    "divisor_override",
)

register(
    OpDef(
        "max_pool2d",
        ("x",),
        _pool_infer("max_pool2d"),
        {"cpu": _k_max_pool2d},
        outputs=("values", "indices"),
        attrs=_POOL,
        host_only=True,
    )
)
register(
    OpDef(
        "max_pool2d_backward",
        ("grad", "indices"),
        _max_pool2d_backward_infer,
        {"cpu": _k_max_pool2d_backward},
        attrs=("input_hw",),
        host_only=True,
    )
)
register(
    OpDef(
        "avg_pool2d",
        ("x",),
        _pool_infer("avg_pool2d"),
        {"cpu": _k_avg_pool2d},
        attrs=_AVG,
        host_only=True,
    )
)
register(
    OpDef(
        "avg_pool2d_backward",
        ("grad",),
        _avg_backward_infer,
        {"cpu": _k_avg_pool2d_backward},
        attrs=_AVG + ("input_hw",),
        host_only=True,
    )
)

# -- adaptive average pooling ----------------------------------------------------------------


def adaptive_matrix(n: int, o: int, dtype):
    """(o, n): row i averages [floor(i*n/o), ceil((i+1)*n/o)), PyTorch's windows."""
    i = np.arange(o)
    start = (i * n) // o
    end = -((-(i + 1) * n) // o)
    cols = np.arange(n)
    inside = (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])
    return (inside / (end - start)[:, None]).astype(dtype)


def _adaptive_infer(metas, attrs):
    x = metas[0]
    _float_input("adaptive_avg_pool2d", x)
    _needs_4d("adaptive_avg_pool2d", x)
    oh, ow = attrs["output_size"]
    if x.shape[2] == 0 or x.shape[3] == 0:
        raise ShapeError(
            f"adaptive_avg_pool2d: the input's height and width must be > 0, got shape {x.shape}"
        )
    return [(x.shape[:2] + (oh, ow), x.dtype)]


def _k_adaptive_avg_pool2d(outs, ins, attrs):
    x = ins[0]
    out = outs[0]
    h, w = x.shape[2:]
    oh, ow = out.shape[2:]
    acc = np.float32 if x.dtype == np.float16 else x.dtype
    ah, aw = adaptive_matrix(h, oh, acc), adaptive_matrix(w, ow, acc)
    np.copyto(out, np.matmul(np.matmul(ah, x.astype(acc, copy=False)), aw.T), casting="unsafe")


def _adaptive_backward_infer(metas, attrs):
    g = metas[0]
    return [(g.shape[:2] + tuple(attrs["input_hw"]), g.dtype)]


def _k_adaptive_avg_pool2d_backward(outs, ins, attrs):
    g = ins[0]
    out = outs[0]
    h, w = out.shape[2:]
    oh, ow = g.shape[2:]
    acc = np.float32 if g.dtype == np.float16 else g.dtype
    ah, aw = adaptive_matrix(h, oh, acc), adaptive_matrix(w, ow, acc)
    np.copyto(out, np.matmul(np.matmul(ah.T, g.astype(acc, copy=False)), aw), casting="unsafe")


register(
    OpDef(
        "adaptive_avg_pool2d",
        ("x",),
        _adaptive_infer,
        {"cpu": _k_adaptive_avg_pool2d},
        attrs=("output_size",),
        host_only=True,
    )
)
register(
    OpDef(
        "adaptive_avg_pool2d_backward",
        ("grad",),
        _adaptive_backward_infer,
        {"cpu": _k_adaptive_avg_pool2d_backward},
        attrs=("input_hw",),
        host_only=True,
    )
)
