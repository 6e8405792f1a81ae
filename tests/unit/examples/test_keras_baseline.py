"""examples/keras_baseline.py --fleet-batches: each step is made of the batches the fleet's agents
draw in that round, as the agent's own code (agent.runtime.load_training) draws them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from agent.config import AgentConfig
from agent.runtime import load_training

ROOT = Path(__file__).resolve().parents[3]
AGENTS, BATCH, SEED = 3, 8, 5


def baseline() -> ModuleType:
    spec = importlib.util.spec_from_file_location("keras_baseline", ROOT / "examples" / "keras_baseline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("partition", ["iid", "shards:2"])
def test_fleet_batches_are_the_agents_batches_round_by_round(partition: str) -> None:
    keras_baseline = baseline()
    data = keras_baseline.agents_data(None, "digits", (64,), 0.1, SEED)
    draws = keras_baseline.fleet_batches(data, AGENTS, BATCH, partition, SEED)
    streams = [load_training(AgentConfig.model_validate(
        {"id": a, "fleet_size": AGENTS, "model": "examples/digits/model.py:factory", "dataset": "digits",
         "partition": partition, "batch": BATCH, "seed": SEED})).batches for a in range(AGENTS)]
    # Past the end of the smallest part's epoch: the streams reshuffle as the agents' do.
    for _ in range(40):
        x, y = next(draws)
        drawn = [next(stream) for stream in streams]
        assert np.array_equal(x, np.concatenate([xa for xa, _ in drawn]))
        assert np.array_equal(y, np.concatenate([ya for _, ya in drawn]))


def test_the_whole_set_batches_are_not_the_fleets() -> None:
    keras_baseline = baseline()
    data = keras_baseline.agents_data(None, "digits", (64,), 0.1, SEED)
    x_fleet, _ = next(keras_baseline.fleet_batches(data, AGENTS, BATCH, "iid", SEED))
    x_whole, _ = next(keras_baseline.whole_batches(data, AGENTS * BATCH, SEED))
    assert x_fleet.shape == x_whole.shape and not np.array_equal(x_fleet, x_whole)


def test_the_baselines_adam_is_the_agents_and_keras_differs_on_small_gradients() -> None:
    import tensorflow as tf  # the export extra, which CI installs

    from agent.model.optim import Adam

    keras_baseline = baseline()
    rng = np.random.default_rng(1)
    start = rng.normal(size=50).astype(np.float32)
    # Gradients from 1e-8 to 1: where epsilon matters and where it does not.
    grads = [(rng.normal(size=50) * np.logspace(-8, 0, 50)).astype(np.float32) for _ in range(5)]
    ours, theirs = tf.Variable(start), tf.Variable(start)
    adam_ours = keras_baseline.AgentAdam([ours], 0.01)
    adam_keras = tf.keras.optimizers.Adam(0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    agents, params = Adam(0.01), start.copy()
    for grad in grads:
        adam_ours.apply_gradients([(tf.constant(grad), ours)])
        adam_keras.apply_gradients([(tf.constant(grad), theirs)])
        params = agents.step(params, grad)
    np.testing.assert_allclose(ours.numpy(), params, rtol=0, atol=1e-6)
    assert np.max(np.abs(theirs.numpy() - params)) > 1e-3
