"""The two leaks of issue 57 on the clear path: what a parent learns from a child's unit.

Each test states what the parent recovers from the unit it receives; the same attacks run on
what a parent receives with masking on (tests/unit/privacy/test_masking.py) and find noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from agent.model import mlp
from agent.model.data import Dataset, load_mnist
from tests.unit.privacy.leaks import recover_image, recover_label_counts


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_mnist(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def params() -> np.ndarray:
    return mlp.init_params(np.random.default_rng(0))  # the start of training, as the fleet's


def test_a_parent_recovers_a_batch_of_one_childs_image_exactly(mnist: Dataset, params: np.ndarray) -> None:
    image, label = mnist.x_train[7:8], mnist.y_train[7:8]
    _, unit = mlp.loss_and_grad(params, image, label)
    recovered = recover_image(unit)
    assert np.max(np.abs(recovered - image[0])) < 1e-5
    assert image[0].max() > 0.9  # a real digit, not a blank that anything matches


def test_a_parent_recovers_a_batchs_label_counts_from_the_output_bias(mnist: Dataset, params: np.ndarray) -> None:
    child_x, child_y = mnist.x_train[:100], mnist.y_train[:100]
    own_x = mnist.x_train[30000:31000]  # the parent's own data, its own predictions
    _, unit = mlp.loss_and_grad(params, child_x, child_y)
    recovered = recover_label_counts(unit, params, own_x, batch=100)
    true = np.bincount(child_y, minlength=10)
    assert np.max(np.abs(recovered - true)) <= 1
    assert np.sum(np.abs(recovered - true)) <= 3
