"""The .tflite builder: deterministic bytes, builtin ops only, resource variables, signatures.

Reads the model back with the schema module of ai-edge-litert (no interpreter here; running
the model is tests/integration/test_litert_backend.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema  # a dev dependency (setup.sh --dev)

from agent.model import mlp
from agent.model.tflite_builder import OptimizerSpec, build_model

ADAM = OptimizerSpec("adam", 1e-3)


@pytest.fixture(scope="module")
def params() -> np.ndarray:
    return mlp.init_params(np.random.default_rng(0))


def test_same_weights_give_the_same_bytes(params: np.ndarray) -> None:
    assert build_model(params, ADAM) == build_model(params.copy(), ADAM)
    other = params.copy()
    other[0] += 1
    assert build_model(other, ADAM) != build_model(params, ADAM)
    assert build_model(params, OptimizerSpec("sgd", 0.01, 0.9)) != build_model(params, ADAM)


def test_model_is_tflite_with_builtin_ops_and_resource_variables(params: np.ndarray) -> None:
    blob = build_model(params, ADAM)
    assert blob[4:8] == b"TFL3"
    model = schema.ModelT.InitFromPackedBuf(blob, 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    codes = {names[c.builtinCode] for c in model.operatorCodes}
    assert all(c.customCode is None for c in model.operatorCodes)
    assert {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"} <= codes
    assert {"BATCH_MATMUL", "SOFTMAX", "LOG_SOFTMAX", "RELU", "SQRT"} <= codes
    assert "POW" not in codes  # Adam's corrections come in as an input (libm's pow differs)
    signatures = {s.signatureKey.decode(): s for s in model.signatureDefs}
    assert {"infer", "gradients", "apply", "get_weights", "set_weights"} <= set(signatures)
    outputs = {n.name.decode() for n in signatures["gradients"].outputs}
    assert outputs == {"loss", "gradients"}
    inputs = {n.name.decode() for n in signatures["apply"].inputs}
    assert inputs == {"gradients", "lr", "bias_corrections"}


def test_initial_weights_are_stored_bit_exact(params: np.ndarray) -> None:
    model = schema.ModelT.InitFromPackedBuf(build_model(params, ADAM), 0)
    stored = [bytes(bytearray(b.data)) for b in model.buffers if b.data is not None]
    assert params.tobytes() in stored


def test_bad_arguments_are_clear_errors(params: np.ndarray) -> None:
    with pytest.raises(ValueError, match="407050"):
        build_model(params[:10], ADAM)
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_model(params, OptimizerSpec("rmsprop", 0.1))
