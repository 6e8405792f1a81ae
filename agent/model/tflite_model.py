"""A user's `.tflite` model (written by `edgegrove model export`) as a ``Model``.

The file is stateless: its signatures take the parameters as one flat float32 vector
(docs/MODELS.md, "LiteRT"), so the interpreter computes loss, gradients and scores and the
agent keeps the parameters and the optimizer, exactly as for a numpy model:
  gradients(params, x, y) -> loss, grad;  infer(params, x) -> scores;
  initial_weights() -> params;  metadata() -> json (uint8 bytes)
Runs on ai-edge-litert alone (the device install); never imports TensorFlow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model.contract import F32, ModelError, TensorSpec
from agent.model.litert_backend import _interpreter_class

SIGNATURES = ("gradients", "infer", "initial_weights", "metadata")
# Rows per signature call. The interpreter's activation memory grows with the batch it last
# ran (the CNN example, gradients and scores: +60 MB at 25/64 rows, +39 MB at 10/32, measured),
# so batches go through in chunks: an agent with the CNN stays within a Pi's 150 MB. Small
# chunks cost no time here (0.42 s vs 0.44 s for 100 rows; scores of 1,000 rows: 2.75 s in
# chunks of 8, 2.80 s in chunks of 32, which held 3.7 MB more).
GRADIENT_CHUNK = 10
PREDICT_CHUNK = 8
METADATA_FORMAT = 1


class TfliteModel:
    """``Model`` over the signatures of an exported `.tflite` (one interpreter, XNNPACK on)."""

    def __init__(self, path: str | Path, num_threads: int | None = 1) -> None:
        self.path = Path(path)
        try:
            interpreter = _interpreter_class()(model_path=str(self.path), num_threads=num_threads)
        except ImportError:
            raise
        except Exception as exc:
            raise ModelError(f"model {self.path} is not a loadable .tflite file: {exc}") from exc
        found = interpreter.get_signature_list()
        missing = [key for key in SIGNATURES if key not in found]
        if missing:
            raise ModelError(
                f"model {self.path} has no {', '.join(missing)} signature"
                f"{'s' if len(missing) > 1 else ''} (it has: {', '.join(found) or 'none'}); "
                "write it with `edgegrove model export` (docs/MODELS.md)")
        self._run = {key: interpreter.get_signature_runner(key) for key in SIGNATURES}
        self._interpreter = interpreter
        meta = _metadata(self.path, self._run["metadata"]())
        self.name: str = meta["name"]
        self.input_shape: tuple[int, ...] = tuple(meta["input_shape"])
        self.num_classes: int = meta["num_classes"]
        running = set(meta.get("running", ()))
        self.tensors: tuple[TensorSpec, ...] = tuple(
            TensorSpec(str(name), tuple(int(d) for d in shape), running=name in running)
            for name, shape in meta["tensors"])
        # Batch norm in training mode normalises over the batch it is given: one call per batch.
        self._gradient_chunk = None if running else GRADIENT_CHUNK
        self._initial = np.ascontiguousarray(
            self._run["initial_weights"]()["params"], dtype=np.float32).copy()
        if self._initial.shape != (self.param_count,):
            raise ModelError(f"model {self.path}: initial_weights has shape {self._initial.shape} "
                             f"but its metadata's tensors hold {self.param_count} parameters")
        self._label_dtype = np.dtype(self._run["gradients"].get_input_details()["y"]["dtype"])

    @property
    def param_count(self) -> int:
        return sum(t.size for t in self.tensors)

    @property
    def signatures(self) -> dict[str, Any]:
        """Signature name -> {"inputs": [...], "outputs": [...]} (for `model check`)."""
        return dict(self._interpreter.get_signature_list())

    def initial_params(self, seed: int) -> F32:
        """The file's initial weights (chosen at export; the same for every seed)."""
        return self._initial.copy()

    def loss_and_grad(self, params: F32, x: F32, y: npt.NDArray[np.int64]) -> tuple[float, F32]:
        """The batch's mean loss and gradient: the chunks' means weighted by their rows."""
        params = np.ascontiguousarray(params, dtype=np.float32)
        x, y = self._batch(x), np.ascontiguousarray(y, dtype=self._label_dtype)
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"need equal, non-empty x and y, got {len(x)} and {len(y)} rows")
        loss, grad = 0.0, np.zeros(self.param_count, dtype=np.float64)
        scaled = np.empty_like(grad)  # one float64 temporary for every chunk, not two per chunk
        chunk = self._gradient_chunk or len(x)
        for start in range(0, len(x), chunk):
            rows = slice(start, start + chunk)
            out = self._run["gradients"](params=params, x=x[rows], y=y[rows])
            share = len(y[rows]) / len(y)
            loss += float(out["loss"]) * share
            grad += np.multiply(out["grad"], share, out=scaled, dtype=np.float64)
        return loss, grad.astype(np.float32)

    def predict(self, params: F32, x: F32) -> F32:
        params = np.ascontiguousarray(params, dtype=np.float32)
        x = self._batch(x)
        chunks = [np.array(self._run["infer"](params=params, x=x[i:i + PREDICT_CHUNK])["scores"],
                           dtype=np.float32)
                  for i in range(0, len(x), PREDICT_CHUNK)]
        return np.concatenate(chunks) if chunks else np.zeros((0, self.num_classes), np.float32)

    def _batch(self, x: F32) -> F32:
        return np.ascontiguousarray(x, dtype=np.float32).reshape(-1, *self.input_shape)


def _metadata(path: Path, out: dict[str, Any]) -> dict[str, Any]:
    """The metadata signature's JSON, checked; ModelError (one line) if it is not ours."""
    try:
        meta = json.loads(bytes(np.asarray(out["json"], dtype=np.uint8)).decode())
        ok = (isinstance(meta, dict) and meta.get("format") == METADATA_FORMAT
              and isinstance(meta["name"], str) and isinstance(meta["num_classes"], int)
              and all(isinstance(d, int) and d > 0 for d in meta["input_shape"])
              and all(isinstance(n, str) and all(isinstance(d, int) and d > 0 for d in s)
                      for n, s in meta["tensors"])
              and set(meta.get("running", ())) <= {n for n, _ in meta["tensors"]})
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"model {path}: its metadata signature is not edgegrove's ({exc})") from exc
    if not ok:
        raise ModelError(f"model {path}: its metadata signature is not edgegrove's format "
                         f"{METADATA_FORMAT}; export it again with `edgegrove model export`")
    return dict(meta)
