"""Each layer whose gradient export writes with builtin ops, exported for real: the `.tflite`'s
gradient on LiteRT equals TensorFlow's own gradient of the Keras model (tape over the model in
inference mode, the same mean cross-entropy), and its scores equal the model's. Depthwise
convolutions, ReLU6, average pools, hard-swish and sigmoid, a residual addition (two operands
of the dynamic batch), recurrent layers unrolled (LSTM, GRU, bidirectional), and a loop export
cannot unroll refused in one line. Needs TensorFlow (the export extra): fails without it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import keras
    import tensorflow as tf
except ImportError:  # pragma: no cover - CI installs it
    pytest.fail("TensorFlow is not installed: `pip install 'edgegrove[export]'` "
                "(scripts/setup.sh --dev does)", pytrace=False)

from agent.commands.model_export import ExportError, export
from agent.model.tflite_model import TfliteModel

L = keras.layers


def _image(*layers: Any, shape: tuple[int, ...] = (9, 9, 3)) -> Any:
    return keras.Sequential([keras.Input(shape), *layers, L.Flatten(), L.Dense(3)])


def _residual() -> Any:
    inputs = keras.Input((6, 6, 2))
    branch = L.Conv2D(2, 3, padding="same")(inputs)
    added = L.Add()([inputs, branch])  # [B, 6, 6, 2] + [B, 6, 6, 2]: both of the dynamic batch
    return keras.Model(inputs, L.Dense(3)(L.Flatten()(L.Multiply()([added, branch]))))


def _sequence(layer: Any) -> Any:
    return keras.Sequential([keras.Input((6, 4)), layer, L.Dense(3)])


MODELS: dict[str, Callable[[], Any]] = {
    "depthwise-same-stride1": lambda: _image(L.DepthwiseConv2D(3, padding="same")),
    "depthwise-valid-stride2-multiplier2": lambda: _image(
        L.DepthwiseConv2D(3, strides=2, depth_multiplier=2)),
    "depthwise-same-stride2": lambda: _image(L.DepthwiseConv2D(3, strides=2, padding="same")),
    "relu6": lambda: _image(L.Conv2D(4, 3), L.ReLU(6.0)),
    "leaky-relu": lambda: _image(L.Conv2D(4, 3), L.LeakyReLU(0.2)),
    "elu": lambda: _image(L.Conv2D(4, 3), L.ELU()),
    "avg-pool-valid": lambda: _image(L.Conv2D(2, 2), L.AveragePooling2D(2)),
    "avg-pool-same": lambda: _image(L.AveragePooling2D(3, strides=2, padding="same")),
    "hard-swish": lambda: _image(L.Conv2D(3, 3, activation="hard_swish")),
    "sigmoid": lambda: _image(L.Conv2D(3, 3, activation="sigmoid")),
    "residual-add": _residual,
    "lstm": lambda: _sequence(L.LSTM(5)),
    "gru": lambda: _sequence(L.GRU(5)),
    "bidirectional-lstm-sequences": lambda: keras.Sequential([
        keras.Input((6, 4)), L.Bidirectional(L.LSTM(3, return_sequences=True)),
        L.GlobalAveragePooling1D(), L.Dense(3)]),
}


def _tf_loss_and_grad(model: Any, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    with tf.GradientTape() as tape:
        logits = model(x, training=False)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    grads = tape.gradient(loss, model.trainable_variables)
    return float(loss), np.concatenate([g.numpy().ravel() for g in grads])


@pytest.mark.parametrize("case", sorted(MODELS))
def test_the_exported_gradient_equals_tensorflows(case: str, tmp_path: Path) -> None:
    keras.utils.set_random_seed(0)
    model = MODELS[case]()
    path = tmp_path / "m.tflite"
    path.write_bytes(export(model))
    exported = TfliteModel(path)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, *exported.input_shape)).astype(np.float32)
    y = rng.integers(0, 3, 7)
    params = exported.initial_params(0)
    loss, grad = exported.loss_and_grad(params, x, y)
    tf_loss, tf_grad = _tf_loss_and_grad(model, x, y.astype(np.int32))
    assert abs(loss - tf_loss) < 1e-5 * max(1.0, abs(tf_loss))
    assert np.linalg.norm(tf_grad) > 1e-3  # a gradient that could be wrong
    np.testing.assert_allclose(grad, tf_grad, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(exported.predict(params, x), model(x, training=False).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_a_loop_export_cannot_unroll_is_refused_naming_what_to_use() -> None:
    def cumulative(x: Any) -> Any:  # a while-loop over time inside a layer
        return tf.scan(lambda acc, step: acc + step, tf.transpose(x, [1, 0, 2]))[-1]

    model = keras.Sequential([keras.Input((6, 4)), L.Dense(4), L.Lambda(cumulative), L.Dense(3)])
    with pytest.raises(ExportError) as refused:
        export(model)
    said = str(refused.value)
    assert "while-loop" in said and "LSTM, GRU" in said and "Select" not in said
    assert "\n" not in said


def _normed() -> Any:
    return keras.Sequential([
        keras.Input((8, 8, 2)), L.Conv2D(4, 3), L.BatchNormalization(momentum=0.9), L.ReLU(),
        L.Dropout(0.5), L.GlobalAveragePooling2D(), L.Dense(3)])


def test_batch_norm_in_training_mode_carries_its_running_statistics(tmp_path: Path) -> None:
    keras.utils.set_random_seed(0)
    model = _normed()
    path = tmp_path / "bn.tflite"
    path.write_bytes(export(model, batch_norm="train"))
    exported = TfliteModel(path)
    running = [t.name for t in exported.tensors if t.running]
    assert running == ["batch_normalization/moving_mean", "batch_normalization/moving_variance"]
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert exported.param_count == trainable + 8
    rng = np.random.default_rng(2)
    x = rng.normal(1.0, 2.0, size=(12, 8, 8, 2)).astype(np.float32)  # 12 rows: more than a chunk
    y = rng.integers(0, 3, 12)
    params = exported.initial_params(0)
    loss, grad = exported.loss_and_grad(params, x, y)
    # TensorFlow, training mode: batch statistics in the forward pass (dropout off, as exported)
    model.layers[3].rate = 0.0
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        tf_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y.astype(np.int32), logits))
    tf_grad = np.concatenate([g.numpy().ravel() for g in tape.gradient(tf_loss, model.trainable_variables)])
    assert abs(loss - float(tf_loss)) < 1e-5
    np.testing.assert_allclose(grad[:trainable], tf_grad, rtol=1e-4, atol=1e-5)
    # The statistics' places hold the running average's step: (1 - momentum)(batch - old),
    # the step Keras itself took (model(..., training=True) just updated them).
    old_mean, old_var = params[trainable:trainable + 4], params[trainable + 4:]
    norm = model.layers[1]
    np.testing.assert_allclose(grad[trainable:trainable + 4], norm.moving_mean.numpy() - old_mean,
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad[trainable + 4:], norm.moving_variance.numpy() - old_var,
                               rtol=1e-4, atol=1e-6)
    # Scores use the running statistics held in the vector.
    moved = params.copy()
    moved[trainable:] += grad[trainable:]
    np.testing.assert_allclose(exported.predict(moved, x), model(x, training=False).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_frozen_batch_norm_keeps_its_statistics_out_of_the_vector(tmp_path: Path) -> None:
    keras.utils.set_random_seed(0)
    model = _normed()
    path = tmp_path / "frozen.tflite"
    path.write_bytes(export(model))
    exported = TfliteModel(path)
    assert not any(t.running for t in exported.tensors)
    assert exported.param_count == sum(int(np.prod(v.shape)) for v in model.trainable_variables)
