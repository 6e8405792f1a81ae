"""The model contract: the fingerprint names one model with one set of initial weights."""

from __future__ import annotations

import numpy as np

from agent.model.contract import TensorSpec, fingerprint
from agent.model.mlp_model import MlpModel
from examples.digits.model import DigitsMLP


class WiderDigits(DigitsMLP):
    tensors = (TensorSpec("a", (64, 129)), TensorSpec("b", (129,)), TensorSpec("c", (129, 10)),
               TensorSpec("d", (10,)))


class RenamedDigits(DigitsMLP):
    name = "another-name"


def test_fingerprint_is_16_hex_and_stable() -> None:
    first = fingerprint(DigitsMLP(), 0)
    assert len(first) == 16 and int(first, 16) >= 0
    assert fingerprint(DigitsMLP(), 0) == first


def test_fingerprint_differs_for_other_weights_and_other_models() -> None:
    base = fingerprint(DigitsMLP(), 0)
    assert fingerprint(DigitsMLP(), 1) != base  # other initial weights
    assert fingerprint(MlpModel(), 0) != base
    assert fingerprint(WiderDigits(), 0) != base


def test_fingerprint_ignores_the_name() -> None:
    assert fingerprint(RenamedDigits(), 3) == fingerprint(DigitsMLP(), 3)


def test_tensor_spec_size_and_thesis_layout() -> None:
    model = MlpModel()
    assert TensorSpec("w", (784, 512)).size == 401408
    assert sum(t.size for t in model.tensors) == model.param_count == 407050
    params = model.initial_params(0)
    assert params.dtype == np.float32 and params.shape == (407050,)
