"""The MNIST CNN of ``model.py`` in Keras, for ``edgegrove model export``:

    edgegrove model export examples/mnist_cnn/build.py:build_model -o mnist_cnn.tflite

Same layers, same layouts, and the same initial weights (``model.init_weights``), so the
``.tflite`` and the numpy model train one fleet together.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def _numpy_twin() -> ModuleType:
    """``model.py`` beside this file, whatever the current directory or sys.path."""
    name = "edgegrove_example_mnist_cnn_model"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("model.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_model(seed: int = 0) -> Any:
    import keras

    twin = _numpy_twin()
    model = keras.Sequential(
        [
            keras.Input(twin.INPUT_SHAPE),
            keras.layers.Conv2D(32, twin.KERNEL, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(twin.POOL),
            keras.layers.Conv2D(64, twin.KERNEL, activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(twin.POOL),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu", name="dense1"),
            keras.layers.Dense(twin.NUM_CLASSES, name="dense2"),
        ],
        name="mnist-cnn",
    )
    model.set_weights(twin.init_weights(seed))
    return model
