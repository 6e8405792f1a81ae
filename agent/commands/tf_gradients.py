"""Gradients that LiteRT's builtin kernels can run, for ``edgegrove model export``.

TensorFlow's own gradients of a convolution, a ReLU and a max-pool are the ops
Conv2DBackpropFilter, ReluGrad and MaxPoolGrad, which have no LiteRT builtin kernel (only the
TF-Select "Flex" delegate runs them, and the ai-edge-litert wheel a device installs has none).
While a model is traced for export, ``builtin_gradients()`` swaps in gradient functions made of
ops that do lower to builtins: a kernel's gradient as one matrix product per kernel offset
(strided slices of the input), a convolution's input gradient as TRANSPOSE_CONV (dilated
kernels: scattered matrix products), and element-wise masks, pads and reshapes for ReLU and
max-pool. Imported only by the export command (it needs
TensorFlow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

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
    data_format = op.get_attr("data_format")
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


BUILTIN_GRADIENTS: dict[str, GradientFn] = {
    "Conv2D": _conv2d_grad,
    "Relu": _relu_grad,
    "MaxPool": _max_pool_grad,
}


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
        yield
    finally:
        for name in BUILTIN_GRADIENTS:
            if name in saved:
                table[name] = saved[name]
            else:
                table.pop(name, None)
