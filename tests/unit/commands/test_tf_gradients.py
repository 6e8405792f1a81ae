"""The builtin-lowerable gradients of tf_gradients equal TensorFlow's own (Conv2D with strides,
padding and dilation; depthwise convolutions with strides, padding and multipliers; ReLU,
ReLU6, leaky ReLU and ELU; overlapping and SAME max- and average pools), and the registry is restored after.
Needs TensorFlow (the export extra; scripts/setup.sh --dev installs it): fails without it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import tensorflow as tf
except ImportError:  # pragma: no cover - CI installs it
    pytest.fail("TensorFlow is not installed: `pip install 'edgegrove[export]'` "
                "(scripts/setup.sh --dev does)", pytrace=False)

from agent.commands.tf_gradients import BUILTIN_GRADIENTS, builtin_gradients


def _grads(fn: Callable[..., Any], *inputs: np.ndarray) -> list[np.ndarray]:
    tensors = [tf.constant(v) for v in inputs]
    with tf.GradientTape() as tape:
        for t in tensors:
            tape.watch(t)
        # A non-uniform upstream gradient, so every position's weight matters.
        out = fn(*tensors)
        loss = tf.reduce_sum(out * tf.sin(tf.reshape(tf.range(tf.size(out), dtype=tf.float32),
                                                     tf.shape(out))))
    return [g.numpy() for g in tape.gradient(loss, tensors)]


def _same_as_tf(fn: Callable[..., Any], *inputs: np.ndarray) -> None:
    expected = _grads(fn, *inputs)
    with builtin_gradients():
        ours = _grads(fn, *inputs)
    for a, b in zip(ours, expected, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("strides", "padding", "dilations"), [
    (1, "VALID", 1), (2, "SAME", 1), (1, "SAME", 2), ((2, 1), "VALID", 1), (3, "SAME", 1),
])
def test_conv2d(strides: Any, padding: str, dilations: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 11, 9, 4)).astype(np.float32)
    kernel = rng.normal(size=(3, 2, 4, 5)).astype(np.float32)
    conv = lambda a, k: tf.nn.conv2d(a, k, strides, padding, dilations=dilations)  # noqa: E731
    if dilations == 1:
        _same_as_tf(conv, x, kernel)
        return
    # TensorFlow's CPU kernels have no dilated input gradient: the reference is the same
    # convolution with the zeros of the dilation written into the kernel.
    reference = lambda a, k: tf.nn.conv2d(a, _dilated(k, dilations), strides, padding)  # noqa: E731
    np.testing.assert_allclose(conv(x, kernel).numpy(), reference(x, kernel).numpy(), rtol=1e-5, atol=1e-5)
    expected = _grads(reference, x, kernel)
    with builtin_gradients():
        ours = _grads(conv, x, kernel)
    for a, b in zip(ours, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _dilated(kernel: Any, d: int) -> Any:
    kh, kw, cin, cout = kernel.shape
    where = [[i * d, j * d] for i in range(kh) for j in range(kw)]
    return tf.scatter_nd(where, tf.reshape(kernel, [kh * kw, cin, cout]),
                         [(kh - 1) * d + 1, (kw - 1) * d + 1, cin, cout])


def test_relu() -> None:
    x = np.random.default_rng(1).normal(size=(4, 6, 6, 3)).astype(np.float32)
    _same_as_tf(tf.nn.relu, x)


@pytest.mark.parametrize(("size", "strides", "padding"), [
    (2, 2, "VALID"), (3, 2, "VALID"), (3, 1, "SAME"), (2, 2, "SAME"), (3, 3, "SAME"),
])
def test_max_pool(size: int, strides: int, padding: str) -> None:
    # Distinct values: TensorFlow gives a tied maximum's gradient to one element, ours to all.
    x = np.random.default_rng(2).permutation(3 * 9 * 7 * 2).reshape(3, 9, 7, 2).astype(np.float32)
    _same_as_tf(lambda a: tf.nn.max_pool2d(a, size, strides, padding), x)


@pytest.mark.parametrize(("strides", "padding", "multiplier"), [
    (1, "VALID", 1), (1, "SAME", 1), (2, "SAME", 1), (2, "VALID", 1), (1, "SAME", 2), (2, "VALID", 3),
])
def test_depthwise_conv2d(strides: int, padding: str, multiplier: int) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 9, 8, 4)).astype(np.float32)
    kernel = rng.normal(size=(3, 3, 4, multiplier)).astype(np.float32)
    _same_as_tf(lambda a, k: tf.nn.depthwise_conv2d(a, k, [1, strides, strides, 1], padding), x, kernel)


@pytest.mark.parametrize("activation", [tf.nn.relu6, lambda a: tf.nn.leaky_relu(a, 0.1), tf.nn.elu])
def test_relu6_leaky_relu_elu(activation: Callable[[Any], Any]) -> None:
    x = 4 * np.random.default_rng(4).normal(size=(4, 6, 6, 3)).astype(np.float32)
    _same_as_tf(activation, x)


@pytest.mark.parametrize(("size", "strides", "padding"), [
    (2, 2, "VALID"), (3, 2, "VALID"), (3, 1, "SAME"), (2, 2, "SAME"), (3, 2, "SAME"), (2, 1, "VALID"),
])
def test_avg_pool(size: int, strides: int, padding: str) -> None:
    x = np.random.default_rng(5).normal(size=(3, 9, 7, 2)).astype(np.float32)
    _same_as_tf(lambda a: tf.nn.avg_pool2d(a, size, strides, padding), x)


@pytest.mark.parametrize("cut", [
    lambda a: a[:, 1:3], lambda a: a[:, -2:], lambda a: a[1:, ::2], lambda a: a[:, 1],
    lambda a: a[..., :2], lambda a: a[::-1, 2:5],
])
def test_strided_slice(cut: Callable[[Any], Any]) -> None:
    _same_as_tf(cut, np.random.default_rng(6).normal(size=(4, 6, 3)).astype(np.float32))


def test_a_slice_of_the_dynamic_batch_pads_its_gradient_back() -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
    def grad(x: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(x[:, 1:4] * tf.constant([1.0, 2.0, 3.0]))
        return tape.gradient(loss, x)

    with builtin_gradients():
        graph = grad.get_concrete_function().graph
        assert "StridedSliceGrad" not in {op.type for op in graph.get_operations()}
    np.testing.assert_array_equal(grad(np.ones((2, 6), np.float32)).numpy(),
                                  [[0, 1, 2, 3, 0, 0]] * 2)


def test_concat() -> None:
    rng = np.random.default_rng(7)
    a, b = (rng.normal(size=(3, 4, n)).astype(np.float32) for n in (2, 5))
    _same_as_tf(lambda u, v: tf.concat([u, v, u], axis=-1), a, b)


def test_registry_is_restored() -> None:
    from tensorflow.python.framework import ops

    before = {name: ops._gradient_registry.lookup(name) for name in BUILTIN_GRADIENTS}
    with builtin_gradients():
        assert all(ops._gradient_registry.lookup(n) is f for n, f in BUILTIN_GRADIENTS.items())
    assert {name: ops._gradient_registry.lookup(name) for name in BUILTIN_GRADIENTS} == before
