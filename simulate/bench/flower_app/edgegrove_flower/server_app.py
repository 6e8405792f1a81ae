"""The ServerApp: FedAvg over every connected node, the global model evaluated on the full
MNIST test set after every round, one JSON line per round appended to ``log-path``.

The loop is FedAvg's own (``configure_train``, ``send_and_receive``, ``aggregate_train``),
written out so that the run stops at the target accuracy and says, per round, when it began
and ended, how many nodes were asked and how many replied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from agent.model import mlp
from agent.model.data import load_mnist

app = ServerApp()


def _log(path: str, record: dict[str, Any]) -> None:
    if path:
        with Path(path).open("a") as out:
            out.write(json.dumps(record) + "\n")


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float,
                     poll_s: float) -> list[Message]:
    """``Grid.send_and_receive`` with a chosen polling interval (its own sleeps 3 s between
    polls): push, then pull every ``poll_s`` until every reply is in or ``timeout`` passed."""
    waiting = set(grid.push_messages(messages))
    replies: list[Message] = []
    deadline = time.time() + timeout
    while waiting and time.time() < deadline:
        got = list(grid.pull_messages(waiting))
        replies += got
        waiting -= {m.metadata.reply_to_message_id for m in got}
        if waiting:
            time.sleep(poll_s)
    return replies


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes, seed, path = int(cfg["nodes"]), int(cfg["seed"]), str(cfg["log-path"])
    test = load_mnist()
    arrays = ArrayRecord([mlp.init_params(np.random.default_rng(seed))])
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes,
                      min_evaluate_nodes=0, min_available_nodes=nodes)
    _log(path, {"event": "start", "t": time.time()})
    for server_round in range(1, int(cfg["max-rounds"]) + 1):
        started = time.time()
        _log(path, {"event": "round-start", "round": server_round, "t": started})
        train_config = ConfigRecord({"lr": float(cfg["lr"]), "batch": int(cfg["batch"]),
                                     "local-steps": int(cfg["local-steps"]), "seed": seed,
                                     "non-iid": bool(cfg["non-iid"]),
                                     "server-round": server_round})
        # configure_train waits until every node is connected: the round's clock starts after.
        messages = list(strategy.configure_train(server_round, arrays, train_config, grid))
        sent = time.time()
        replies = send_and_receive(grid, messages, float(cfg["round-timeout"]), float(cfg["poll-s"]))
        ended = time.time()
        good = [r for r in replies if not r.has_error()]
        aggregated, _ = strategy.aggregate_train(server_round, good)
        if aggregated is not None:
            arrays = aggregated
        params = arrays.to_numpy_ndarrays()[0].astype(np.float32)
        accuracy = mlp.accuracy(params, test.x_test, test.y_test)
        metrics = [dict(r.content["metrics"]) for r in good]
        _log(path, {"event": "round", "round": server_round, "t_start": started, "t_sent": sent,
                    "t_end": ended,
                    "asked": len(messages), "replied": len(good), "accuracy": accuracy,
                    "train_s": [m.get("train-s") for m in metrics],
                    "load_s": [m.get("load-s") for m in metrics],
                    "partitions": sorted(int(m.get("partition-id", -1)) for m in metrics)})
        if accuracy >= float(cfg["target"]) and bool(cfg["stop-at-target"]):
            break
    _log(path, {"event": "end", "t": time.time()})
