"""The PyTorch adapter (agent/model/torch_model.py): a module's trainable parameters are the
flat vector in ``named_parameters()`` order, frozen ones stay in the module; the gradient of
the flat vector is torch autograd's of the module's mean cross-entropy; scores are the
module's output; each seed's initial weights are the builder's under that seed. Needs torch
(the torch extra, a CPU wheel): fails without it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover - the dev extra installs it
    pytest.fail("torch is not installed: `pip install 'edgegrove[torch]'`", pytrace=False)

from agent.model.backend import ModelBackend
from agent.model.contract import ModelError, fingerprint
from agent.model.optim import Adam
from agent.model.torch_model import TorchModel


def _cnn() -> Any:
    from torch import nn

    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 5))


def _frozen_first_layer() -> Any:
    module = _cnn()
    for p in module[0].parameters():
        p.requires_grad_(False)
    return module


def _batch(n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 5, n)


def test_the_gradient_is_autograds_and_scores_the_modules() -> None:
    model = TorchModel(_cnn, (1, 8, 8), 5, name="tiny")
    assert [t.name for t in model.tensors] == ["0.weight", "0.bias", "4.weight", "4.bias"]
    assert model.param_count == 36 + 4 + 320 + 5
    params = model.initial_params(0)
    x, y = _batch()
    loss, grad = model.loss_and_grad(params, x, y)
    torch.manual_seed(0)
    reference = _cnn().eval()
    expected_loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
    expected_loss.backward()
    expected = np.concatenate([p.grad.numpy().ravel() for p in reference.parameters()])
    assert abs(loss - float(expected_loss)) < 1e-6
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        np.testing.assert_allclose(model.predict(params, x), reference(torch.from_numpy(x)).numpy(),
                                   rtol=1e-6, atol=1e-6)
    assert grad.dtype == np.float32 and grad.shape == (model.param_count,)


def test_each_seed_gives_the_builders_weights_under_it() -> None:
    model = TorchModel(_cnn, (1, 8, 8), 5)
    assert np.array_equal(model.initial_params(3), TorchModel(_cnn, (1, 8, 8), 5).initial_params(3))
    assert not np.array_equal(model.initial_params(0), model.initial_params(1))
    assert fingerprint(model, 0) != fingerprint(model, 1)


def test_frozen_parameters_stay_out_of_the_vector_and_the_fleets_step_moves_the_rest() -> None:
    model = TorchModel(_frozen_first_layer, (1, 8, 8), 5)
    assert [t.name for t in model.tensors] == ["4.weight", "4.bias"]
    backend = ModelBackend(model, model.initial_params(0), Adam(lr=0.01))
    x, y = _batch(12)
    before = backend.evaluate(x, y)[0]
    for _ in range(20):
        backend.apply(backend.gradients(x, y)[1])
    assert backend.evaluate(x, y)[0] < before - 0.1


def test_a_builder_that_gives_no_module_is_one_line() -> None:
    with pytest.raises(ModelError, match=r"gave a dict, not a torch\.nn\.Module"):
        TorchModel(dict, (1, 8, 8), 5, name="bad")
