"""The numpy backend behind the Backend interface: state transfer, hashes, errors."""

from __future__ import annotations

import numpy as np
import pytest

from agent.model import mlp
from agent.model.backend import NumpyBackend, make_backend


def _batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((16, 784), dtype=np.float32), rng.integers(0, 10, 16)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_backend_loaded_from_a_peers_state_stays_byte_identical(optimizer: str) -> None:
    peer = make_backend("numpy", np.random.default_rng(0), optimizer)
    for seed in range(3):
        peer.apply(peer.gradients(*_batch(seed))[1])
    joiner = make_backend("numpy", np.random.default_rng(99), optimizer)
    assert joiner.model_hash() != peer.model_hash()
    joiner.load_state(peer.state())
    for seed in range(3, 6):
        grad = peer.gradients(*_batch(seed))[1]
        peer.apply(grad)
        joiner.apply(grad)
    assert joiner.state().tobytes() == peer.state().tobytes()
    assert joiner.model_hash() == peer.model_hash()


def test_state_is_params_then_step_then_slots() -> None:
    backend = make_backend("numpy", np.random.default_rng(0), "adam")
    state = backend.state()
    assert state.dtype == np.float32 and state.shape == (3 * mlp.PARAM_COUNT + 1,)
    np.testing.assert_array_equal(state[: mlp.PARAM_COUNT], backend.params())
    backend.apply(backend.gradients(*_batch(0))[1])
    assert backend.state()[mlp.PARAM_COUNT] == 1.0


def test_gradients_do_not_change_the_model_and_apply_does() -> None:
    backend = make_backend("numpy", np.random.default_rng(0), "sgd", lr=0.1)
    before = backend.model_hash()
    loss, grad = backend.gradients(*_batch(0))
    assert backend.model_hash() == before and loss > 0 and grad.dtype == np.float32
    backend.apply(grad)
    assert backend.model_hash() != before
    assert backend.evaluate(*_batch(0))[0] < loss
    assert backend.accuracy(*_batch(1)) == backend.evaluate(*_batch(1))[1]


def test_model_hash_is_crc32_of_the_param_bytes() -> None:
    import zlib

    backend = make_backend("numpy", np.random.default_rng(3))
    assert backend.model_hash() == zlib.crc32(backend.params().tobytes())
    assert 0 <= backend.model_hash() < 2**32


def test_params_are_copies_and_set_params_checks_the_length() -> None:
    backend = make_backend("numpy", np.random.default_rng(0))
    params = backend.params()
    params[:] = 0
    assert backend.params().any()
    backend.set_params(params)
    assert not backend.params().any()
    with pytest.raises(ValueError, match="407050"):
        backend.set_params(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="state must be"):
        backend.load_state(np.zeros(7, np.float32))


def test_unknown_backend_or_optimizer_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        make_backend("tpu", np.random.default_rng(0))
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_backend("numpy", np.random.default_rng(0), "lbfgs")
    assert isinstance(make_backend("numpy", np.random.default_rng(0)), NumpyBackend)


def test_litert_without_ai_edge_litert_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for module in ("ai_edge_litert", "ai_edge_litert.schema_py_generated",
                   "ai_edge_litert.interpreter", "tflite_runtime", "tflite_runtime.interpreter"):
        monkeypatch.setitem(sys.modules, module, None)  # None in sys.modules: import fails
    with pytest.raises(ImportError, match=r"pip install 'edgegrove\[litert\]'"):
        make_backend("litert", np.random.default_rng(0))
    assert make_backend("numpy", np.random.default_rng(0)).name == "numpy"  # numpy still works
