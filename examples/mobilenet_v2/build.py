"""MobileNetV2 (alpha 0.35) from scratch on 32x32 RGB images, for ``edgegrove model export``:

    edgegrove model export examples/mobilenet_v2/build.py:build_model -o mobilenet_v2.tflite

``keras.applications.MobileNetV2`` with no pretrained weights (``weights=None``): inverted
residual blocks of depthwise convolutions, ReLU6 and residual additions, a global average
pool and a 10-way dense layer giving logits. Its initial weights come from one seed, so the
export and the single-machine Keras baseline (``keras_baseline.py``) start from the same
parameters. Exported with ``--batch-norm train`` batch norm trains as Keras trains it
(``model.fit``); with the default (frozen) it runs on the statistics calibrated here.
"""

from __future__ import annotations

from typing import Any

INPUT_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
ALPHA = 0.35
# Keras's MobileNetV2 averages batch norm's statistics with momentum 0.999, over ~1,000 steps
# or more: longer than the runs here (800 rounds), which would evaluate with statistics still
# weighted towards the untrained network's. 0.9 follows the last ~10 steps.
BATCH_NORM_MOMENTUM = 0.9


def build_model(seed: int = 0, input_shape: tuple[int, int, int] = INPUT_SHAPE) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV2(
        input_shape=input_shape, alpha=ALPHA, weights=None, classes=NUM_CLASSES,
        classifier_activation=None, name="mobilenet-v2-0.35")
    calibrate_batch_norm(model, seed)
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = BATCH_NORM_MOMENTUM
    return model


def calibrate_batch_norm(model: Any, seed: int, samples: int = 64) -> None:
    """Every batch norm's statistics set to what it sees at initialisation, on seeded noise
    images: the exported network runs batch norm on fixed statistics, and those left at their
    defaults (mean 0, variance 1) let the activations shrink or grow block after block until
    the untrained network's output no longer depends on its input. Measured on noise, not on
    anyone's data: the same statistics on every machine."""
    import keras
    import numpy as np

    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    momentum = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0  # the statistics of this one batch replace the defaults
    noise = np.random.default_rng(seed).random((samples, *model.inputs[0].shape[1:]), dtype=np.float32)
    model(noise, training=True)
    for layer, m in zip(norms, momentum, strict=True):
        layer.momentum = m
