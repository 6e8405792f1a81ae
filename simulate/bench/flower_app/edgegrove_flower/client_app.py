"""The ClientApp: ``local-steps`` steps of Edgegrove's numpy MLP with our Adam on this node's
MNIST shard, from the global model the ServerApp sent.

Flower starts a new ClientApp process for every message (subprocess isolation), so the
shard is loaded every round (its seconds are reported apart from training's) and the Adam
moments travel in ``context.state``, Flower's documented place for state that outlives a
round. The shard is Edgegrove's own: ``load_mnist_shard(partition-id, num-partitions)``,
the function an Edgegrove agent calls.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from agent.model.backend import NumpyBackend
from agent.model.data import BatchStream, load_mnist_shard
from agent.model.optim import make_optimizer

OPTIMIZER_STATE = "optimizer"

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    started = time.monotonic()
    partition = int(context.node_config["partition-id"])
    count = int(context.node_config["num-partitions"])
    config = msg.content["config"]
    seed, server_round = int(config["seed"]), int(config["server-round"])
    shard = load_mnist_shard(partition, count, non_iid=bool(config["non-iid"]), seed=seed,
                             test_limit=1, raw_pixels=True)
    loaded = time.monotonic()
    params = msg.content["arrays"].to_numpy_ndarrays()[0].astype(np.float32)
    backend = NumpyBackend(params, make_optimizer("adam", float(config["lr"])))
    if OPTIMIZER_STATE in context.state:
        backend.optimizer.load_state_vector(context.state[OPTIMIZER_STATE].to_numpy_ndarrays()[0])
    batches = BatchStream(shard.x_train, shard.y_train, int(config["batch"]),
                          np.random.default_rng([seed, partition, server_round]))
    loss = 0.0
    steps = int(config["local-steps"])
    for _ in range(steps):
        x, y = next(batches)
        loss, grad = backend.gradients(x, y)
        backend.apply(grad)
    context.state[OPTIMIZER_STATE] = ArrayRecord([backend.optimizer.state_vector()])
    trained = time.monotonic()
    metrics = MetricRecord({"num-examples": steps * batches.batch_size, "loss": float(loss),
                            "load-s": loaded - started, "train-s": trained - loaded,
                            "partition-id": partition})
    content = RecordDict({"arrays": ArrayRecord([backend.params()]), "metrics": metrics})
    return Message(content=content, reply_to=msg)
