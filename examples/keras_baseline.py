"""The single-machine baseline for a fleet's run of an exported Keras model: the same network,
initial weights, data, optimizer and number of steps, trained by Keras on one machine.

    python examples/keras_baseline.py examples/mobilenet_v2/build.py:build_model \\
        --data FOLDER --agents 7 --batch 16 --rounds 800 --lr 0.002 --lr-final 0.05
    python examples/keras_baseline.py examples/sequence_lstm/build.py:build_model \\
        --dataset digits --agents 7 --batch 16 --rounds 300 --lr 0.01

A fleet of A agents with batches of B averages A gradients of B samples a round, which is one
step on A x B samples: the baseline takes ``rounds`` Adam steps on batches of A x B drawn from
the whole training set (every agent's part together, IID), with the agent's Adam constants.
The test set is the agents' own: the same seeded holdout of the same folder (or the packaged
dataset's test split). The forward pass
runs as the export runs it: ``--batch-norm frozen`` (export's default) on the statistics the
network was built with (``training=False``); ``--batch-norm train`` as ``model export
--batch-norm train`` runs it in a fleet: each agent's batch normalised by its own statistics,
so the step's A x B samples go through as A batches of B (gradients averaged), and the moving
statistics move by the mean of the A batches' running-average steps.

With ``--fleet-batches`` the A x B samples of a step are the very batches the fleet's agents
draw in that round (agent a's part of ``--partition``, its own batch stream seeded
``[seed, a]``, in agent order): the two runs then differ only in their arithmetic, not in the
draw of the batches (a clean run of ``sync_every = 1``, every agent in every round)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _builder(source: str) -> Any:
    path, _, function = source.rpartition(":")
    spec = importlib.util.spec_from_file_location("edgegrove_baseline_build", Path(path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def agents_data(folder: Path | None, dataset: str | None, input_shape: tuple[int, ...],
                holdout: float, seed: int) -> Any:
    """The data as every agent sees it before the split: training samples and the test set."""
    from agent.model.datasets import load_dataset, with_holdout
    from agent.model.user_data import load_user_data

    whole = load_dataset(dataset) if dataset else load_user_data(folder, input_shape)  # type: ignore[arg-type]
    whole = with_holdout(whole, holdout, seed)
    return replace(whole, x_train=whole.x_train.reshape(-1, *input_shape),
                   x_test=whole.x_test.reshape(-1, *input_shape))


def frozen_step(model: Any, optimizer: Any) -> Any:
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(x, training=False)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    return step


def fleet_batch_norm_step(model: Any, optimizer: Any, agents: int) -> Any:
    """One step as a fleet of ``agents`` takes it with ``--batch-norm train``."""
    import tensorflow as tf

    trainable, state = model.trainable_variables, model.non_trainable_variables
    moving = [v.path.endswith(("moving_mean", "moving_variance")) for v in state]

    @tf.function
    def step(x: Any, y: Any) -> Any:
        xs, ys = tf.split(x, agents), tf.split(y, agents)
        weights, old = [v.value for v in trainable], [v.value for v in state]
        grads, moved, losses = None, [tf.zeros_like(v) for v in old], []
        for xa, ya in zip(xs, ys, strict=True):
            with tf.GradientTape() as tape:
                tape.watch(weights)
                logits, new = model.stateless_call(weights, old, xa, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(ya, logits))
            g = tape.gradient(loss, weights)
            grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
            moved = [m + (n - o) for m, n, o in zip(moved, new, old, strict=True)]
            losses.append(loss)
        assert grads is not None  # agents >= 1
        optimizer.apply_gradients(zip([g / agents for g in grads], trainable, strict=True))
        for v, o, m, is_moving in zip(state, old, moved, moving, strict=True):
            if is_moving:
                v.assign(o + m / agents)
        return tf.add_n(losses) / agents

    return step


def whole_batches(data: Any, batch: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches of ``batch`` drawn from the whole training set, an epoch at a time."""
    rng = np.random.default_rng(seed)
    order, at = rng.permutation(len(data.y_train)), 0
    while True:
        if at + batch > len(order):
            order, at = rng.permutation(len(data.y_train)), 0
        rows = order[at:at + batch]
        at += batch
        yield data.x_train[rows], data.y_train[rows]


def fleet_batches(data: Any, agents: int, batch: int, partition: str,
                  seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each round's batches as the fleet's agents draw them (agent/runtime.py), concatenated
    in agent order: agent a's part of ``partition`` and its own stream seeded ``[seed, a]``."""
    from agent.model import partition as partitions
    from agent.model.data import BatchStream

    streams = []
    for a in range(agents):
        picked = partitions.part(data.y_train, a, agents, partition, seed)
        streams.append(BatchStream(data.x_train[picked], data.y_train[picked], batch,
                                   np.random.default_rng([seed, a])))
    while True:
        drawn = [next(stream) for stream in streams]
        yield np.concatenate([x for x, _ in drawn]), np.concatenate([y for _, y in drawn])


class AgentAdam:
    """The agents' Adam (agent/model/optim.py): Kingma & Ba's Algorithm 1, epsilon added to
    sqrt(v_hat). Keras's Adam adds it to sqrt(v) before the bias correction, which in the first
    steps is an epsilon tens of times larger relative to v_hat (1 / sqrt(1 - 0.999^t))."""

    def __init__(self, variables: list[Any], lr: float, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-7) -> None:
        import tensorflow as tf

        self.b1, self.b2, self.eps = b1, b2, eps
        self.learning_rate = tf.Variable(lr, dtype=tf.float32, trainable=False)
        self.step = tf.Variable(0.0, dtype=tf.float32, trainable=False)
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]

    def apply_gradients(self, pairs: Any) -> None:
        import tensorflow as tf

        self.step.assign_add(1.0)
        t = tf.cast(self.step, tf.float64)
        correction1 = tf.cast(1.0 - tf.pow(tf.constant(self.b1, tf.float64), t), tf.float32)
        correction2 = tf.cast(1.0 - tf.pow(tf.constant(self.b2, tf.float64), t), tf.float32)
        for (grad, variable), m, v in zip(pairs, self.m, self.v, strict=True):
            m.assign(m * self.b1 + grad * (1.0 - self.b1))
            v.assign(v * self.b2 + grad * grad * (1.0 - self.b2))
            variable.assign_sub(self.learning_rate * (m / correction1) / (tf.sqrt(v / correction2) + self.eps))


def train(model: Any, data: Any, steps: int, draws: Iterator[tuple[np.ndarray, np.ndarray]], lr: float,
          eval_every: int, agents: int | None = None,
          lr_final: float | None = None, adam: str = "agent") -> list[tuple[int, float]]:
    """(step, test accuracy) every ``eval_every`` steps and at the end; with ``agents``, batch
    norm in training mode over each agent's share of the batch; with ``lr_final``, the agent's
    linear schedule (``--lr-schedule linear --lr-final``)."""
    import tensorflow as tf

    from agent.protocol.schedule import scheduled_lr

    optimizer: Any = (AgentAdam(model.trainable_variables, lr) if adam == "agent"
                      else tf.keras.optimizers.Adam(lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7))
    step = (frozen_step(model, optimizer) if agents is None
            else fleet_batch_norm_step(model, optimizer, agents))

    curve: list[tuple[int, float]] = []
    for n, (x, y) in zip(range(1, steps + 1), draws, strict=False):
        if lr_final is not None:
            optimizer.learning_rate.assign(scheduled_lr(lr, n - 1, steps, "linear", lr_final))
        step(x, y.astype(np.int32))
        if n == steps or (eval_every and n % eval_every == 0):
            curve.append((n, accuracy(model, data.x_test, data.y_test)))
            print(f"step {n}: test accuracy {curve[-1][1]:.4f}", flush=True)
    return curve


def accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    scores = np.concatenate([model(x[i:i + 256], training=False).numpy()
                             for i in range(0, len(x), 256)])
    return float(np.mean(scores.argmax(axis=1) == y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="path/to/build.py:function, the builder the fleet's file was exported from")
    parser.add_argument("--data", type=Path, default=None, help="the folder the fleet trained on")
    parser.add_argument("--dataset", default=None, help="or the packaged dataset (digits)")
    parser.add_argument("--agents", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16, help="each agent's batch")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--holdout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0, help="the fleet's --seed (the holdout)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--batch-norm", choices=("frozen", "train"), default="frozen")
    parser.add_argument("--lr-final", type=float, default=None,
                        help="the agents' --lr-schedule linear --lr-final (default: constant)")
    parser.add_argument("--fleet-batches", action="store_true",
                        help="each step on the batches the fleet's agents draw in that round (see above)")
    parser.add_argument("--partition", default="iid", help="the fleet's --partition (with --fleet-batches)")
    parser.add_argument("--adam", choices=("agent", "keras"), default="agent",
                        help="agent: the agents' own Adam formula (default); keras: Keras's Adam, whose "
                             "epsilon sits before the bias correction")
    args = parser.parse_args()
    model = _builder(args.source)()
    data = agents_data(args.data, args.dataset, tuple(int(d) for d in model.inputs[0].shape[1:]),
                       args.holdout, args.seed)
    started = time.monotonic()
    draws = (fleet_batches(data, args.agents, args.batch, args.partition, args.seed) if args.fleet_batches
             else whole_batches(data, args.agents * args.batch, args.seed))
    curve = train(model, data, args.rounds, draws, args.lr, args.eval_every,
                  args.agents if args.batch_norm == "train" else None, args.lr_final, args.adam)
    schedule = "" if args.lr_final is None else f" linear to {args.lr_final} of it"
    print(f"keras single machine: {args.rounds} steps of {args.agents} x {args.batch}, "
          f"adam ({args.adam}'s) lr {args.lr}{schedule}, batch norm {args.batch_norm}{', the fleet batches' if args.fleet_batches else ''}: test accuracy {curve[-1][1]:.4f} on {len(data.y_test)} test "
          f"samples ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
