"""The LiteRT backend: the MLP as a trainable ``.tflite`` model run by ``ai-edge-litert``.

The model comes from ``tflite_builder`` (our own writer, no TensorFlow); forward, loss,
backward AND the optimizer step (SGD with momentum or Adam) run inside the interpreter, through
the model's signatures. Imported lazily by ``make_backend`` so that devices without
``ai-edge-litert`` still run the numpy backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model import mlp
from agent.model.backend import check_flat, params_hash
from agent.model.optim import SGD, Adam
from agent.model.tflite_builder import OptimizerSpec, build_model, state_size

F32 = npt.NDArray[np.float32]
EVAL_CHUNK = 5000  # rows per evaluate call: bounds the activations' memory on a small device


def _interpreter_class() -> Any:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        try:  # the deprecated predecessor, where it is still installed
            from tflite_runtime.interpreter import Interpreter
        except ImportError as exc:
            raise ImportError(
                "the litert backend needs ai-edge-litert: `pip install 'edgegrove[litert]'` "
                "(or use --backend numpy)"
            ) from exc
    return Interpreter


def optimizer_spec(optimizer: SGD | Adam) -> OptimizerSpec:
    if isinstance(optimizer, Adam):
        return OptimizerSpec("adam", optimizer.lr, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps)
    return OptimizerSpec("sgd", optimizer.lr, momentum=optimizer.momentum)


class LitertBackend:
    """Same interface as ``NumpyBackend``; the optimizer runs in the graph (``apply``)."""

    name = "litert"

    def __init__(self, params: F32, optimizer: SGD | Adam, num_threads: int | None = 1) -> None:
        """``num_threads=1``: a fleet runs several agents per core; XNNPACK is fast on one."""
        params = check_flat(params, mlp.PARAM_COUNT, "params")
        self.spec = optimizer_spec(optimizer)
        self.model_bytes = build_model(params, self.spec)
        self.state_size = state_size(self.spec)
        self._lr = np.array([self.spec.lr], dtype=np.float32)
        self._interpreter = _interpreter_class()(
            model_content=self.model_bytes, num_threads=num_threads
        )
        self._run = {
            key: self._interpreter.get_signature_runner(key)
            for key in self._interpreter.get_signature_list()
        }

    def params(self) -> F32:
        return np.array(self._run["get_weights"]()["params"], dtype=np.float32)

    def set_params(self, flat: F32) -> None:
        self._run["set_weights"](params=check_flat(flat, mlp.PARAM_COUNT, "params"))

    def logits(self, x: F32) -> F32:
        return np.array(self._run["infer"](x=np.asarray(x, dtype=np.float32))["logits"])

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        out = self._run["gradients"](x=np.asarray(x, dtype=np.float32), y=_labels(y))
        return float(out["loss"]), np.array(out["gradients"], dtype=np.float32)

    def apply(self, grad: F32) -> None:
        self._run["apply"](gradients=check_flat(grad, mlp.PARAM_COUNT, "gradient"), lr=self._lr)

    def set_learning_rate(self, lr: float) -> None:
        self._lr = np.array([lr], dtype=np.float32)

    def evaluate(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, float]:
        total_loss, correct = 0.0, 0
        for start in range(0, len(x), EVAL_CHUNK):
            xs = np.asarray(x[start : start + EVAL_CHUNK], dtype=np.float32)
            ys = y[start : start + EVAL_CHUNK]
            out = self._run["evaluate"](x=xs, y=_labels(ys))
            total_loss += float(out["loss"]) * len(xs)
            correct += int(np.sum(np.argmax(out["logits"], axis=1) == ys))
        return total_loss / len(x), correct / len(x)

    def state(self) -> F32:
        return np.array(self._run["get_state"]()["state"], dtype=np.float32)

    def load_state(self, state: F32) -> None:
        self._run["set_state"](state=check_flat(state, self.state_size, "state"))

    def model_hash(self) -> int:
        return params_hash(self.params())


def _labels(y: npt.NDArray[np.integer]) -> npt.NDArray[np.int32]:
    labels = np.asarray(y)
    if labels.size and (labels.min() < 0 or labels.max() >= mlp.N_OUT):
        raise ValueError(f"labels must be in 0..{mlp.N_OUT - 1}")
    return labels.astype(np.int32)
