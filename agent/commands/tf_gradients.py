"""Gradients that LiteRT's builtin kernels can run, for ``edgegrove model export``.

TensorFlow's own gradients of a convolution, a depthwise convolution, ReLU, ReLU6, leaky ReLU, ELU,
max- and average pools, slices and concatenations are ops such as Conv2DBackpropFilter,
DepthwiseConv2dNativeBackpropInput, ReluGrad, Relu6Grad, LeakyReluGrad, EluGrad, MaxPoolGrad, AvgPoolGrad,
StridedSliceGrad or ConcatOffset, which have no LiteRT builtin kernel (only the TF-Select "Flex"
delegate runs them, and the ai-edge-litert wheel a device installs has none). While a model is
traced for export, ``builtin_gradients()`` swaps in gradient functions made of ops that do
lower to builtins: a kernel's gradient as one product per kernel offset (strided slices of the
input), a convolution's input gradient as TRANSPOSE_CONV or DEPTHWISE_CONV_2D (else scattered
products), element-wise masks, pads and reshapes for the activations and pools, pads, gathers
and splits for slices and concatenations. It also tells TensorFlow that two operands of a
binary op that are both of the dynamic batch are the same size there (else their gradient asks
BroadcastGradientArgs at run time). Imported only by the export command (it needs TensorFlow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import array_grad, math_grad

GradientFn = Callable[[Any, Any], Any]


def _padding(op: Any, size: tuple[int, int], window: tuple[int, int],
             strides: tuple[int, int], dilations: tuple[int, int]) -> list[tuple[int, int]]:
    """(before, after) padding of H and W the op applied, from its attributes."""
    padding = op.get_attr("padding")
    padding = padding.decode() if isinstance(padding, bytes) else padding
    if padding == "VALID":
        return [(0, 0), (0, 0)]
    if padding == "EXPLICIT":
        flat = list(op.get_attr("explicit_paddings"))
        return [(flat[2], flat[3]), (flat[4], flat[5])]
    pads = []
    for n, k, s, d in zip(size, window, strides, dilations, strict=True):
        effective = (k - 1) * d + 1
        out = -(-n // s)
        total = max((out - 1) * s + effective - n, 0)
        pads.append((total // 2, total - total // 2))
    return pads


def _nhwc(op: Any) -> None:
    data_format = op.get_attr("data_format") or "NHWC"  # eager ops record None for the default
    data_format = data_format.decode() if isinstance(data_format, bytes) else data_format
    if data_format != "NHWC":
        raise ValueError(f"{op.type} with data_format {data_format}: export supports NHWC only")


def _hw(values: Any) -> tuple[int, int]:
    values = list(values)
    return int(values[1]), int(values[2])


def _window(x: Any, i: int, j: int, out_hw: tuple[int, int], strides: tuple[int, int]) -> Any:
    """x[:, i::sh, j::sw, :] cut to out_hw: the input element each output saw at offset (i, j)."""
    (ho, wo), (sh, sw) = out_hw, strides
    return x[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw, :]


def _scatter(c: Any, i: int, j: int, strides: tuple[int, int], size: tuple[int, int]) -> Any:
    """The inverse of ``_window``: c [B, Ho, Wo, C] placed at rows i + sh*h, columns j + sw*w of
    zeros [B, H, W, C] (4-D reshapes and pads only)."""
    _, ho, wo, ch = (int(d) if d is not None else -1 for d in c.shape)
    (sh, sw), (h, w) = strides, size
    if sh > 1:  # interleave sh - 1 zero rows after each row
        c = tf.reshape(c, [-1, ho, 1, wo * ch])
        c = tf.pad(c, [[0, 0], [0, 0], [0, sh - 1], [0, 0]])
        c = tf.reshape(c, [-1, ho * sh, wo, ch])[:, :(ho - 1) * sh + 1]
    rows = (ho - 1) * sh + 1
    if sw > 1:  # the same for columns
        c = tf.reshape(c, [-1, rows * wo, 1, ch])
        c = tf.pad(c, [[0, 0], [0, 0], [0, sw - 1], [0, 0]])
        c = tf.reshape(c, [-1, rows, wo * sw, ch])[:, :, :(wo - 1) * sw + 1]
    cols = (wo - 1) * sw + 1
    return tf.pad(c, [[0, 0], [i, h - i - rows], [j, w - j - cols], [0, 0]])


def _running_sum(parts: Iterable[Any]) -> Any:
    """Added one by one (ADD_N would keep every part alive at once)."""
    iterator = iter(parts)
    total = next(iterator)
    for part in iterator:
        total = total + part
    return total


def _conv2d_grad(op: Any, grad: Any) -> tuple[Any, Any]:
    _nhwc(op)
    x, kernel = op.inputs[0], op.inputs[1]
    kh, kw, cin, cout = (int(d) for d in kernel.shape)
    strides, dilations = _hw(op.get_attr("strides")), _hw(op.get_attr("dilations"))
    size, out_hw = _hw(x.shape), _hw(grad.shape)
    pads = _padding(op, size, (kh, kw), strides, dilations)
    padded = tf.pad(x, [[0, 0], list(pads[0]), list(pads[1]), [0, 0]])
    padded_size = (size[0] + sum(pads[0]), size[1] + sum(pads[1]))
    offsets = [(i * dilations[0], j * dilations[1]) for i in range(kh) for j in range(kw)]
    dy = tf.reshape(grad, [-1, cout])
    # The kernel's gradient, one offset at a time (an im2col of the whole batch would hold
    # kh*kw copies of the input at once).
    dkernel = tf.reshape(tf.stack([
        tf.matmul(tf.reshape(_window(padded, i, j, out_hw, strides), [-1, cin]), dy,
                  transpose_a=True)
        for i, j in offsets]), kernel.shape)
    if dilations == (1, 1):  # TRANSPOSE_CONV
        dpadded = tf.raw_ops.Conv2DBackpropInput(
            input_sizes=tf.stack([tf.shape(x)[0], *padded_size, cin]), filter=kernel,
            out_backprop=grad, strides=[1, *strides, 1], padding="VALID")
    else:  # each offset's share dy @ kernel[i, j]^T, scattered back where that offset read
        parts = tf.reshape(kernel, [kh * kw, cin, cout])
        dpadded = _running_sum(
            _scatter(tf.reshape(tf.matmul(dy, parts[n], transpose_b=True), [-1, *out_hw, cin]),
                     i, j, strides, padded_size)
            for n, (i, j) in enumerate(offsets))
    dx = dpadded[:, pads[0][0]:pads[0][0] + size[0], pads[1][0]:pads[1][0] + size[1], :]
    return dx, dkernel


def _relu_grad(op: Any, grad: Any) -> Any:
    # SELECT_V2 against a scalar zero: no float copy of the mask.
    return tf.where(op.outputs[0] > 0, grad, tf.zeros([], grad.dtype))


def _max_pool_grad(op: Any, grad: Any) -> Any:
    """Every element equal to its window's maximum gets the window's gradient."""
    _nhwc(op)
    x, y = op.inputs[0], op.outputs[0]
    window, strides = _hw(op.get_attr("ksize")), _hw(op.get_attr("strides"))
    size, out_hw = _hw(x.shape), _hw(y.shape)
    pads = _padding(op, size, window, strides, (1, 1))
    if window == strides and pads == [(0, 0), (0, 0)]:
        return _tiled_max_pool_grad(x, y, grad, window)
    padded = tf.pad(x, [[0, 0], list(pads[0]), list(pads[1]), [0, 0]],
                    constant_values=float("-inf"))
    padded_size = (size[0] + sum(pads[0]), size[1] + sum(pads[1]))
    zero = tf.zeros([], grad.dtype)
    dpadded = _running_sum(
        _scatter(tf.where(tf.equal(_window(padded, i, j, out_hw, strides), y), grad, zero),
                 i, j, strides, padded_size)
        for i in range(window[0]) for j in range(window[1]))
    return dpadded[:, pads[0][0]:pads[0][0] + size[0], pads[1][0]:pads[1][0] + size[1], :]


def _tiled_max_pool_grad(x: Any, y: Any, grad: Any, window: tuple[int, int]) -> Any:
    """Non-overlapping windows (stride = size, no padding): one mask over the input seen as
    [B*Ho, kh, Wo, kw*C], the output broadcast over it (no per-offset copies)."""
    (kh, kw), (ho, wo), ch = window, _hw(y.shape), int(x.shape[3])
    h, w = _hw(x.shape)
    whole = (h, w) == (ho * kh, wo * kw)  # no odd last row or column to drop
    cropped = tf.reshape(x if whole else x[:, :ho * kh, :wo * kw, :], [-1, kh, wo, kw * ch])

    def spread(t: Any) -> Any:  # [B, Ho, Wo, C] -> [B*Ho, 1, Wo, kw*C]
        t = tf.reshape(t, [-1, 1, wo, ch])
        return tf.concat([t] * kw, axis=3) if kw > 1 else t

    hit = tf.equal(cropped, spread(y))
    dx = tf.reshape(tf.where(hit, spread(grad), tf.zeros([], grad.dtype)), [-1, ho * kh, wo * kw, ch])
    return dx if whole else tf.pad(dx, [[0, 0], [0, h - ho * kh], [0, w - wo * kw], [0, 0]])


def _depthwise_conv2d_grad(op: Any, grad: Any) -> tuple[Any, Any]:
    """Depthwise convolution (kernel [kh, kw, C, M], output channel c*M + m): the kernel's
    gradient one offset at a time (a product with the output gradient, summed over the batch
    and positions), the input's as one DEPTHWISE_CONV_2D of the output gradient with the
    kernel flipped (multiplier 1, no dilation) or per-offset shares scattered back."""
    _nhwc(op)
    x, kernel = op.inputs[0], op.inputs[1]
    kh, kw, cin, mult = (int(d) for d in kernel.shape)
    strides = _hw(op.get_attr("strides"))
    dilations = _hw(op.get_attr("dilations") or [1, 1, 1, 1])  # eager: None for the default
    size, out_hw = _hw(x.shape), _hw(grad.shape)
    pads = _padding(op, size, (kh, kw), strides, dilations)
    padded = tf.pad(x, [[0, 0], list(pads[0]), list(pads[1]), [0, 0]])
    padded_size = (size[0] + sum(pads[0]), size[1] + sum(pads[1]))
    offsets = [(i * dilations[0], j * dilations[1]) for i in range(kh) for j in range(kw)]
    dy = tf.reshape(grad, [-1, cin, mult])
    dkernel = tf.reshape(tf.stack([
        tf.reduce_sum(tf.reshape(_window(padded, i, j, out_hw, strides), [-1, cin, 1]) * dy, axis=0)
        for i, j in offsets]), kernel.shape)
    if mult == 1 and dilations == (1, 1):
        spread = _scatter(grad, 0, 0, strides, padded_size)  # dy at the rows/columns it came from
        spread = tf.pad(spread, [[0, 0], [kh - 1, 0], [kw - 1, 0], [0, 0]])
        dpadded = tf.nn.depthwise_conv2d(spread, tf.reverse(kernel, [0, 1]), [1, 1, 1, 1], "VALID")
    else:
        parts = tf.reshape(kernel, [kh * kw, cin, mult])
        dpadded = _running_sum(
            _scatter(tf.reshape(tf.reduce_sum(dy * parts[n], axis=2), [-1, *out_hw, cin]),
                     i, j, strides, padded_size)
            for n, (i, j) in enumerate(offsets))
    dx = dpadded[:, pads[0][0]:pads[0][0] + size[0], pads[1][0]:pads[1][0] + size[1], :]
    return dx, dkernel


def _relu6_grad(op: Any, grad: Any) -> Any:
    y = op.outputs[0]
    return tf.where(tf.logical_and(y > 0, y < 6), grad, tf.zeros([], grad.dtype))


def _leaky_relu_grad(op: Any, grad: Any) -> Any:
    alpha = tf.constant(op.get_attr("alpha"), grad.dtype)
    return tf.where(op.inputs[0] > 0, grad, grad * alpha)


def _elu_grad(op: Any, grad: Any) -> Any:
    y = op.outputs[0]  # exp(x) - 1 below zero: its derivative exp(x) is y + 1
    return tf.where(y > 0, grad, grad * (y + 1))


def _avg_pool_grad(op: Any, grad: Any) -> Any:
    """Each output's gradient over its window's size (SAME: the window's elements inside the
    input, as TensorFlow counts them), spread back over the window."""
    _nhwc(op)
    x = op.inputs[0]
    window, strides = _hw(op.get_attr("ksize")), _hw(op.get_attr("strides"))
    size, out_hw = _hw(x.shape), _hw(grad.shape)
    pads = _padding(op, size, window, strides, (1, 1))
    share = grad * tf.constant(1.0 / _window_counts(size, out_hw, window, strides, pads), grad.dtype)
    if window == strides and pads == [(0, 0), (0, 0)]:
        return _tiled_spread(share, size, window)
    padded_size = (size[0] + sum(pads[0]), size[1] + sum(pads[1]))
    dpadded = _running_sum(_scatter(share, i, j, strides, padded_size)
                           for i in range(window[0]) for j in range(window[1]))
    return dpadded[:, pads[0][0]:pads[0][0] + size[0], pads[1][0]:pads[1][0] + size[1], :]


def _window_counts(size: tuple[int, int], out_hw: tuple[int, int], window: tuple[int, int],
                   strides: tuple[int, int], pads: list[tuple[int, int]]) -> np.ndarray:
    """[1, Ho, Wo, 1]: how many input elements each output's window covers."""
    axes = []
    for n, out, k, s, (before, _) in zip(size, out_hw, window, strides, pads, strict=True):
        start = np.arange(out) * s - before
        axes.append(np.minimum(start + k, n) - np.maximum(start, 0))
    return np.outer(axes[0], axes[1]).reshape(1, *out_hw, 1).astype(np.float32)


def _tiled_spread(share: Any, size: tuple[int, int], window: tuple[int, int]) -> Any:
    """Non-overlapping windows: every element of a window gets its output's share."""
    (kh, kw), (h, w) = window, size
    _, ho, wo, ch = (int(d) if d is not None else -1 for d in share.shape)
    t = tf.reshape(share, [-1, 1, wo, ch])
    t = tf.concat([t] * kw, axis=3) if kw > 1 else t
    t = tf.concat([t] * kh, axis=1) if kh > 1 else t
    dx = tf.reshape(t, [-1, ho * kh, wo * kw, ch])
    whole = (h, w) == (ho * kh, wo * kw)
    return dx if whole else tf.pad(dx, [[0, 0], [0, h - ho * kh], [0, w - wo * kw], [0, 0]])


def _strided_slice_grad(op: Any, grad: Any) -> tuple[Any, None, None, None]:
    """A slice of a tensor whose shape is known (a GRU's kernel cut into its gates): each
    input element gathers the output gradient of the position it went to, or a zero. The slice
    is worked out once at trace time on the input's flat indices. (A slice of a batch of
    unknown size keeps TensorFlow's gradient.)"""
    x = op.inputs[0]
    masks = {key: op.get_attr(key) for key in (
        "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    bounds = [tf.get_static_value(t) for t in op.inputs[1:4]]
    if any(b is None for b in bounds) or x.shape.rank is None:
        return array_grad._StridedSliceGrad(op, grad)
    pads = _slice_pads(x.shape.as_list(), bounds, masks)
    if pads is not None:
        return tf.pad(grad, pads), None, None, None
    if not x.shape.is_fully_defined():
        return array_grad._StridedSliceGrad(op, grad)
    size = int(np.prod(x.shape.as_list()))
    with tf.init_scope():  # eager, on constants
        taken = tf.raw_ops.StridedSlice(
            input=tf.reshape(tf.range(size), x.shape), begin=bounds[0], end=bounds[1],
            strides=bounds[2], **masks).numpy().ravel()
    source = np.full(size, taken.size, dtype=np.int32)  # the extra zero appended below
    source[taken] = np.arange(taken.size, dtype=np.int32)
    padded = tf.concat([tf.reshape(grad, [-1]), tf.zeros([1], grad.dtype)], axis=0)
    return tf.reshape(tf.gather(padded, source), x.shape), None, None, None


def _slice_pads(shape: list[int | None], bounds: list[Any],
                masks: dict[str, int]) -> list[list[int]] | None:
    """(before, after) zeros per axis that put a plain slice's gradient back in place (every
    stride 1, no new or dropped axes; an axis of unknown size taken whole), or None."""
    begin, end, strides = (list(np.ravel(b)) for b in bounds)
    if (masks["ellipsis_mask"] or masks["new_axis_mask"] or masks["shrink_axis_mask"]
            or any(int(v) != 1 for v in strides) or len(begin) > len(shape)):
        return None
    pads = []
    for axis, dim in enumerate(shape):
        sliced = axis < len(begin)
        first = 0 if not sliced or masks["begin_mask"] >> axis & 1 else int(begin[axis])
        whole_end = not sliced or masks["end_mask"] >> axis & 1
        if dim is None:
            if first != 0 or not whole_end:
                return None
            pads.append([0, 0])
            continue
        last = dim if whole_end else int(end[axis])
        first, last = (v + dim if v < 0 else v for v in (first, last))
        first, last = min(max(first, 0), dim), min(max(last, 0), dim)
        pads.append([first, dim - max(last, first)])
    return pads


def _concat_grad(op: Any, grad: Any) -> list[Any]:
    """A concatenation's gradient split back by the parts' sizes along the axis, when those are
    known (TensorFlow's works them out at run time with ShapeN and ConcatOffset, no builtins)."""
    *parts, axis_tensor = op.inputs
    axis = tf.get_static_value(axis_tensor)
    rank = parts[0].shape.rank
    sizes = None if axis is None or rank is None else [p.shape[int(axis) % rank] for p in parts]
    if sizes is None or any(n is None for n in sizes):
        return array_grad._ConcatGradV2(op, grad)
    return [*tf.split(grad, [int(n) for n in sizes], axis=int(axis)), None]


BUILTIN_GRADIENTS: dict[str, GradientFn] = {
    "ConcatV2": _concat_grad,
    "StridedSlice": _strided_slice_grad,
    "Conv2D": _conv2d_grad,
    "DepthwiseConv2dNative": _depthwise_conv2d_grad,
    "Relu": _relu_grad,
    "Relu6": _relu6_grad,
    "LeakyRelu": _leaky_relu_grad,
    "Elu": _elu_grad,
    "MaxPool": _max_pool_grad,
    "AvgPool": _avg_pool_grad,
}


def _same_batch_not_broadcast(x_shape: Any, y_shape: Any) -> tuple[Any, Any]:
    """TensorFlow's reduction axes for a binary op's gradient, with one more assumption: two
    operands both unknown in one dimension (the dynamic batch) are the same size there.
    TensorFlow's own answer for that case is BroadcastGradientArgs at run time, which has no
    builtin kernel (a residual addition or a hard-swish product would need it)."""
    if x_shape.rank is None or x_shape.rank != y_shape.rank:
        return _REDUCTION_AXES(x_shape, y_shape)
    x_list, y_list = x_shape.as_list(), y_shape.as_list()
    if any((a is None) != (b is None) for a, b in zip(x_list, y_list, strict=True)):
        return _REDUCTION_AXES(x_shape, y_shape)
    pairs = list(enumerate(zip(x_list, y_list, strict=True)))
    return ([n for n, (a, b) in pairs if a == 1 and b not in (1, None)],
            [n for n, (a, b) in pairs if b == 1 and a not in (1, None)])


_REDUCTION_AXES = math_grad._InferGradientReductionAxes


@contextmanager
def builtin_gradients() -> Iterator[None]:
    """TensorFlow's gradient registry with ``BUILTIN_GRADIENTS`` in place, restored after.
    (``tf.RegisterGradient`` refuses to replace a registered op, so the registry's table is
    edited directly.)"""
    table = tf_ops._gradient_registry._registry
    saved = {name: table[name] for name in BUILTIN_GRADIENTS if name in table}
    try:
        for name, fn in BUILTIN_GRADIENTS.items():
            table[name] = {**saved.get(name, {}), "type": fn}
        math_grad._InferGradientReductionAxes = _same_batch_not_broadcast
        yield
    finally:
        math_grad._InferGradientReductionAxes = _REDUCTION_AXES
        for name in BUILTIN_GRADIENTS:
            if name in saved:
                table[name] = saved[name]
            else:
                table.pop(name, None)
