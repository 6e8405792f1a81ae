"""The LiteRT backend: the MLP as a trainable ``.tflite`` model run by ``ai-edge-litert``.

The model comes from ``tflite_builder`` (our own writer, no TensorFlow); forward, loss,
backward AND the optimizer step (SGD with momentum or Adam) run inside the interpreter, through
the model's signatures. Imported lazily by ``make_backend`` so that devices without
``ai-edge-litert`` still run the numpy backend.

Two interpreters of the same model. The one that owns the training state (``apply``, weights,
state) runs LiteRT's builtin kernels without the default XNNPACK delegate: those compute
+ - * / and sqrt correctly rounded, so an optimizer step gives the numpy backend's bits on any
CPU (XNNPACK's element-wise kernels do not: measured, Adam differed by ~1 ulp from the first
step). The other, with XNNPACK, computes forward and gradients (~15x faster than the builtin
kernels here); it gets the weights copied in after they change. A gradient may differ from
numpy's in the last bits (summation order), but it is averaged with the fleet's before anyone
applies it: the fleet's models stay bit-identical across backends and CPUs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model import mlp
from agent.model.flat import check_flat, params_hash
from agent.model.optim import SGD, Adam, bias_corrections
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


def _exact_resolver() -> Any:
    """The op resolver without default delegates (builtin kernels only)."""
    try:
        from ai_edge_litert.interpreter import OpResolverType
    except ImportError:
        from tflite_runtime.interpreter import OpResolverType
    return OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES


def optimizer_spec(optimizer: SGD | Adam) -> OptimizerSpec:
    if isinstance(optimizer, Adam):
        return OptimizerSpec("adam", optimizer.lr, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps)
    return OptimizerSpec("sgd", optimizer.lr, momentum=optimizer.momentum)


def _runners(interpreter: Any) -> dict[str, Any]:
    return {key: interpreter.get_signature_runner(key) for key in interpreter.get_signature_list()}


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
        interpreter = _interpreter_class()
        # The training state: exact kernels (see the module's docstring).
        self._exact = interpreter(model_content=self.model_bytes, num_threads=num_threads,
                                  experimental_op_resolver_type=_exact_resolver())
        self._run = _runners(self._exact)
        # Forward and backward: the default delegate (XNNPACK).
        self._fast_interpreter = interpreter(model_content=self.model_bytes, num_threads=num_threads)
        self._fast = _runners(self._fast_interpreter)
        self._steps = 0  # the optimizer's step count, mirrored to compute Adam's corrections
        self._params: F32 | None = params.copy()  # cached; None after the state changed
        self._fast_synced = True  # the fast interpreter holds the current weights
        self._hash: int | None = None

    def _changed(self) -> None:
        self._params, self._hash, self._fast_synced = None, None, False

    def _sync_fast(self) -> None:
        if not self._fast_synced:
            self._fast["set_weights"](params=self.params())
            self._fast_synced = True

    def params(self) -> F32:
        if self._params is None:
            self._params = np.array(self._run["get_weights"]()["params"], dtype=np.float32)
        return self._params.copy()

    def set_params(self, flat: F32) -> None:
        self._run["set_weights"](params=check_flat(flat, mlp.PARAM_COUNT, "params"))
        self._changed()

    def logits(self, x: F32) -> F32:
        self._sync_fast()
        return np.array(self._fast["infer"](x=np.asarray(x, dtype=np.float32))["logits"])

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        self._sync_fast()
        out = self._fast["gradients"](x=np.asarray(x, dtype=np.float32), y=_labels(y))
        return float(out["loss"]), np.array(out["gradients"], dtype=np.float32)

    def apply(self, grad: F32) -> None:
        inputs: dict[str, Any] = {"gradients": check_flat(grad, mlp.PARAM_COUNT, "gradient"),
                                  "lr": self._lr}
        if self.spec.name == "adam":
            inputs["bias_corrections"] = np.array(
                bias_corrections(self.spec.b1, self.spec.b2, self._steps + 1), dtype=np.float32)
        out = self._run["apply"](**inputs)
        self._steps = int(np.asarray(out["step"]).reshape(-1)[0])
        self._changed()

    def set_learning_rate(self, lr: float) -> None:
        self._lr = np.array([lr], dtype=np.float32)

    def evaluate(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, float]:
        self._sync_fast()
        total_loss, correct = 0.0, 0
        for start in range(0, len(x), EVAL_CHUNK):
            xs = np.asarray(x[start : start + EVAL_CHUNK], dtype=np.float32)
            ys = y[start : start + EVAL_CHUNK]
            out = self._fast["evaluate"](x=xs, y=_labels(ys))
            total_loss += float(out["loss"]) * len(xs)
            correct += int(np.sum(np.argmax(out["logits"], axis=1) == ys))
        return total_loss / len(x), correct / len(x)

    def accuracy(self, x: F32, y: npt.NDArray[np.integer]) -> float:
        return self.evaluate(x, y)[1]  # one forward pass gives both: nothing to save

    def state(self) -> F32:
        return np.array(self._run["get_state"]()["state"], dtype=np.float32)

    def load_state(self, state: F32) -> None:
        state = check_flat(state, self.state_size, "state")
        out = self._run["set_state"](state=state)
        self._steps = int(np.asarray(out["step"]).reshape(-1)[0])
        self._changed()

    def model_hash(self) -> int:
        if self._hash is None:
            self._hash = params_hash(self.params())
        return self._hash


def _labels(y: npt.NDArray[np.integer]) -> npt.NDArray[np.int32]:
    labels = np.asarray(y)
    if labels.size and (labels.min() < 0 or labels.max() >= mlp.N_OUT):
        raise ValueError(f"labels must be in 0..{mlp.N_OUT - 1}")
    return labels.astype(np.int32)
