"""What a parent can do with nothing but the unit a child sends it (issue 57's two leaks).

Both attacks read the thesis MLP's flat gradient: ``recover_image`` a batch-of-1 child's input
from the first layer (row r of dL/dW1 over dL/db1[r]); ``recover_label_counts`` a batch's label
counts from the output bias (dL/db2 = mean(probabilities - one-hot)), the probabilities
estimated from the parent's own predictions on its own data with the same model.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agent.model import mlp

F32 = npt.NDArray[np.float32]


def recover_image(unit: F32) -> F32:
    g_w1, g_b1, _, _ = mlp.unpack(unit.astype(np.float64))
    r = int(np.argmax(np.abs(g_b1)))  # the hidden unit the example excited most
    return np.asarray(g_w1[:, r] / g_b1[r], dtype=np.float32)


def recover_label_counts(unit: F32, params: F32, own_x: F32, batch: int) -> npt.NDArray[np.int64]:
    _, _, _, g_b2 = mlp.unpack(unit.astype(np.float64))
    probs, _ = mlp.softmax_parts(mlp.forward(params.astype(np.float64), own_x))
    return np.rint(batch * (probs.mean(axis=0) - g_b2)).astype(np.int64)
