"""An LSTM over a sequence, for ``edgegrove model export`` (the layer is unrolled over the known
sequence length into builtin ops): scikit-learn's 8x8 digits read as sequences of 8 rows of
8 pixels, top to bottom.

    edgegrove model export examples/sequence_lstm/build.py:build_model -o lstm.tflite
    edgegrove simulate --model lstm.tflite --backend litert --dataset digits ...

LSTM 32 -> dense 10 (logits); 5,578 parameters, initial weights from one seed.
"""

from __future__ import annotations

from typing import Any

SEQUENCE = (8, 8)  # 8 steps of 8 features: a digit's rows
NUM_CLASSES = 10


def build_model(seed: int = 0) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(SEQUENCE), keras.layers.LSTM(32, name="lstm"),
                             keras.layers.Dense(NUM_CLASSES, name="logits")], name="digits-lstm")
