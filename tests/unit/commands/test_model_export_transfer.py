"""Transfer learning through export (docs/MODELS.md, "Transfer learning"): a pretrained base
whose weights come from a file the user has, frozen, under a head the fleet trains; then the
base's last block unfrozen. The `.tflite`'s parameter vector holds exactly the trainable
weights (the frozen base is baked into the file), its scores are the model's with the file's
weights, and its gradient is TensorFlow's. Needs TensorFlow (the export extra)."""

from __future__ import annotations

import os
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

from agent.commands.model_export import _import_file, export, load_keras
from agent.model.tflite_model import TfliteModel

BUILDER = '''
import keras

WEIGHTS = {weights!r}


def base():
    L = keras.layers
    return keras.Sequential([
        keras.Input((16, 16, 3)),
        L.Conv2D(8, 3, activation="relu", name="block1_conv"), L.BatchNormalization(name="block1_bn"),
        L.MaxPooling2D(2),
        L.Conv2D(16, 3, activation="relu", name="block2_conv"), L.BatchNormalization(name="block2_bn"),
        L.GlobalAveragePooling2D(name="pool"),
    ], name="base")


def _with_head(pretrained):
    inputs = keras.Input((16, 16, 3))
    features = pretrained(inputs, training=False)  # batch norm on its statistics, always
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(features), name="transfer")


def build_frozen_base():
    pretrained = base()
    pretrained.load_weights(WEIGHTS)
    pretrained.trainable = False
    return _with_head(pretrained)


def build_last_block_unfrozen():
    pretrained = base()
    pretrained.load_weights(WEIGHTS)
    for layer in pretrained.layers:
        layer.trainable = layer.name == "block2_conv"
    return _with_head(pretrained)
'''


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A builder file like a user's, and the "pretrained" weights file it loads (a base whose
    weights and batch-norm statistics are not Keras's initial ones)."""
    root = tmp_path_factory.mktemp("transfer")
    weights = root / "base.weights.h5"
    path = root / "build.py"
    path.write_text(BUILDER.format(weights=str(weights)))
    module = _import_file(path)
    keras.utils.set_random_seed(7)
    pretrained = module.base()
    rng = np.random.default_rng(7)
    pretrained.set_weights([w + rng.normal(0, 0.2, w.shape).astype(np.float32) if "variance" not in v.path
                            else np.abs(w + rng.normal(0, 0.5, w.shape)).astype(np.float32)
                            for w, v in zip(pretrained.get_weights(), pretrained.weights, strict=True)])
    pretrained.save_weights(weights)
    return path


def _exported(source: str, tmp_path: Path) -> tuple[Any, TfliteModel]:
    model = load_keras(source)
    path = tmp_path / "transfer.tflite"
    path.write_bytes(export(model))
    return model, TfliteModel(path)


def _check_against_tensorflow(model: Any, exported: TfliteModel) -> None:
    rng = np.random.default_rng(3)
    x = rng.random((9, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 3, 9)
    params = exported.initial_params(0)
    with tf.GradientTape() as tape:
        logits = model(x, training=False)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y.astype(np.int32), logits))
    expected = np.concatenate([g.numpy().ravel() for g in tape.gradient(loss, model.trainable_variables)])
    np.testing.assert_allclose(exported.loss_and_grad(params, x, y)[1], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(exported.predict(params, x), logits.numpy(), rtol=1e-4, atol=1e-5)


def test_a_frozen_base_from_a_weights_file_under_a_trained_head(builder: Path, tmp_path: Path) -> None:
    model, exported = _exported(f"{builder}:build_frozen_base", tmp_path)
    assert [t.name for t in exported.tensors] == ["head/kernel", "head/bias"]
    assert exported.param_count == 16 * 3 + 3
    # The file's weights are the ones baked in: a base built and loaded here scores the same.
    module = _import_file(builder)
    reference = module.base()
    reference.load_weights(builder.parent / "base.weights.h5")
    features = reference(np.ones((2, 16, 16, 3), np.float32), training=False).numpy()
    kernel, bias = (exported.initial_params(0)[:48].reshape(16, 3), exported.initial_params(0)[48:])
    np.testing.assert_allclose(exported.predict(exported.initial_params(0), np.ones((2, 16, 16, 3), np.float32)),
                               features @ kernel + bias, rtol=1e-4, atol=1e-5)
    _check_against_tensorflow(model, exported)


def test_the_last_block_unfrozen(builder: Path, tmp_path: Path) -> None:
    model, exported = _exported(f"{builder}:build_last_block_unfrozen", tmp_path)
    assert [t.name for t in exported.tensors] == [
        "base/block2_conv/kernel", "base/block2_conv/bias", "head/kernel", "head/bias"]
    assert exported.param_count == 3 * 3 * 8 * 16 + 16 + 16 * 3 + 3
    _check_against_tensorflow(model, exported)
