"""Inference ``.tflite`` files holding a job's trained weights, written without TensorFlow.

Every file written here has one signature a phone or a Pi runs on ai-edge-litert alone:

    infer(x [B, ...]) -> scores [B, classes]

- the thesis MLP: ``agent.model.tflite_builder`` with the trained weights (its ``infer`` takes
  only ``x``; the file can also be trained further);
- a stateless training ``.tflite`` (``edgegrove model export``): a copy whose ``infer`` has
  the parameters as a constant instead of an input (the other training signatures dropped,
  ``metadata`` kept);
- a Python model whose tensors are a dense chain (kernel [n, m], bias [m], ...): dense layers
  with ReLU between them, written only if its scores equal the model's own ``predict``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model import tflite_builder
from agent.model.contract import F32, Model, TensorSpec
from agent.model.tflite_builder import (
    _AlignedBuffer,
    _Graph,
    _ModelParts,
    _opcode,
    _schema,
    _signature,
)

INFER = "infer"
KEEP_SIGNATURES = (INFER, "metadata")
DENSE_TOLERANCE = 1e-4  # relative: float32 sums in another order


class TfliteWriteError(Exception):
    """Why no inference .tflite can be written for this model (one line)."""


def mlp_tflite(params: F32) -> bytes:
    """The thesis MLP with ``params`` (its ``infer(x) -> logits``)."""
    return tflite_builder.build_model(params, tflite_builder.OptimizerSpec("adam", 0.001))


def trained_copy(source: bytes, params: F32) -> bytes:
    """A stateless training .tflite rewritten for inference: ``infer(x)`` with ``params``."""
    schema = _schema()
    model = schema.ModelT.InitFromPackedBuf(source, 0)
    keys = {_text(sd.signatureKey): sd for sd in model.signatureDefs or []}
    if INFER not in keys:
        raise TfliteWriteError(f"the job's .tflite has no {INFER} signature (it has {', '.join(keys)})")
    infer = keys[INFER]
    graph = model.subgraphs[infer.subgraphIndex]
    names = {_text(t.name): t for t in infer.inputs}
    if "params" not in names or "x" not in names:
        raise TfliteWriteError("the job's .tflite infer signature does not take (params, x)")
    params_index = names["params"].tensorIndex
    tensor = graph.tensors[params_index]
    flat = np.ascontiguousarray(params, dtype="<f4")
    if int(np.prod(tensor.shape)) != flat.size:
        raise TfliteWriteError(f"the job's .tflite takes {int(np.prod(tensor.shape))} parameters, "
                               f"the result holds {flat.size}")
    buffer = schema.BufferT()
    buffer.data = flat.tobytes()
    model.buffers.append(buffer)
    tensor.buffer = len(model.buffers) - 1
    tensor.shapeSignature = None
    graph.inputs = [i for i in graph.inputs if i != params_index]
    infer.inputs = [t for t in infer.inputs if t.tensorIndex != params_index]
    model.signatureDefs = [keys[k] for k in KEEP_SIGNATURES if k in keys]
    model.buffers = [_AlignedBuffer(bytes(b.data)) if b.data is not None else _AlignedBuffer(b"")
                     for b in model.buffers]
    return _packed(model, flat.nbytes + len(source))


def dense_chain(tensors: tuple[TensorSpec, ...]) -> list[tuple[int, int]] | None:
    """(inputs, outputs) of each layer when ``tensors`` are kernel [n, m], bias [m] pairs that
    chain (m feeds the next kernel); None for any other layout."""
    if len(tensors) < 2 or len(tensors) % 2:
        return None
    layers: list[tuple[int, int]] = []
    for kernel, bias in zip(tensors[::2], tensors[1::2], strict=True):
        if len(kernel.shape) != 2 or bias.shape != (kernel.shape[1],):
            return None
        if layers and layers[-1][1] != kernel.shape[0]:
            return None
        layers.append((kernel.shape[0], kernel.shape[1]))
    return layers


def dense_tflite(model: Model, params: F32, probe: npt.NDArray[np.float32]) -> bytes:
    """A dense chain (ReLU between layers) with ``params``, checked against ``model.predict``
    on ``probe``; TfliteWriteError if the model is not such a chain."""
    layers = dense_chain(model.tensors)
    if layers is None or layers[0][0] != int(np.prod(model.input_shape)):
        raise TfliteWriteError(f"model {model.name}: its tensors are not a chain of dense layers, "
                               "so no inference .tflite is written (the .npz holds the weights)")
    data = _dense_bytes(model, params, layers)
    want = np.asarray(model.predict(params, probe), dtype=np.float32)
    got = run_infer(data, probe.reshape(len(probe), -1))
    if got.shape != want.shape or not np.allclose(got, want, rtol=DENSE_TOLERANCE,
                                                  atol=DENSE_TOLERANCE * float(np.abs(want).max() + 1)):
        raise TfliteWriteError(f"model {model.name}: dense layers with ReLU do not give its scores "
                               "(another activation?), so no inference .tflite is written")
    return data


def _dense_bytes(model: Model, params: F32, layers: list[tuple[int, int]]) -> bytes:
    schema = _schema()
    parts = _ModelParts(schema)
    g = _Graph(parts, INFER)
    h = g.input("x", [-1, layers[0][0]])
    at = 0
    for i, (n_in, n_out) in enumerate(layers):
        kernel = params[at:at + n_in * n_out].reshape(n_in, n_out)
        bias = params[at + n_in * n_out:at + n_in * n_out + n_out]
        at += n_in * n_out + n_out
        product = g.matmul(h, g.const(f"dense{i}/kernel", kernel), f"dense{i}/matmul", [-1, n_out])
        h = g.binary("ADD", product, g.const(f"dense{i}/bias", bias), f"dense{i}/out", [-1, n_out])
        if i < len(layers) - 1:
            h = g.op("RELU", [h], (f"dense{i}/relu", [-1, n_out], "FLOAT32"))
    g.output("scores", h)
    out = schema.ModelT()
    out.version = 3
    out.description = f"edgegrove {model.name} (inference; written by edgegrove job fetch)"
    out.subgraphs = [g.to_object()]
    out.operatorCodes = [_opcode(schema, code) for code in parts.opcodes]
    out.buffers = [_AlignedBuffer(data) for data in parts.buffers]
    out.signatureDefs = [_signature(schema, g, 0)]
    return _packed(out, params.nbytes)


def _packed(model: Any, size_hint: int) -> bytes:
    import flatbuffers  # present: _schema() checked it

    builder = flatbuffers.Builder(size_hint + (1 << 16))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def run_infer(data: bytes, x: npt.NDArray[np.float32], chunk: int = 64) -> F32:
    """Scores of ``x`` from an inference .tflite's ``infer(x)`` signature, on ai-edge-litert."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=data).get_signature_runner(INFER)
    outputs = [next(iter(runner(x=np.ascontiguousarray(x[i:i + chunk], dtype=np.float32)).values()))
               for i in range(0, len(x), chunk)]
    return np.concatenate(outputs).astype(np.float32) if outputs else np.zeros((0, 0), np.float32)


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")
