"""The single-machine baseline of a run: the same model, the same samples per step, one process.

A fault-free synchronous allreduce of N agents with batch b each is mathematically one machine
training with batch N*b, so that is the curve the fleet is compared with (same seed, same
optimizer, evaluated at the same rounds). It runs after the fleet (not competing for the
CPUs) and is cached by its parameters, so repeated runs pay for it once.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def _cache_dir() -> Path:
    root = os.environ.get("EDGEGROVE_CACHE_DIR") or Path.home() / ".cache" / "edgegrove"
    return Path(root) / "baselines"


def baseline_params(agent: dict[str, Any], nodes: int, rounds: int) -> dict[str, Any]:
    return {
        "rounds": rounds, "batch": int(agent.get("batch", 100)) * nodes,
        "optimizer": agent.get("optimizer", "adam"), "lr": agent.get("lr"),
        "seed": int(agent.get("seed", 0)), "eval_every": int(agent.get("eval_every", 10)),
        "eval_samples": int(agent.get("eval_samples", 10000)), "data": agent.get("data"),
    }


def single_machine(params: dict[str, Any], use_cache: bool = True) -> dict[str, Any]:
    """Train ``rounds`` steps; loss every round, test accuracy at the fleet's eval rounds."""
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    cache = _cache_dir() / f"{key}.json"
    if use_cache and cache.is_file():
        cached: dict[str, Any] = json.loads(cache.read_text())
        return cached
    from agent.model.backend import make_backend
    from agent.model.data import BatchStream, load_mnist

    data = load_mnist(params["data"])
    seed = params["seed"]
    backend = make_backend("numpy", np.random.default_rng(seed), params["optimizer"], params["lr"])
    stream = BatchStream(data.x_train, data.y_train, params["batch"], np.random.default_rng(seed + 1))
    n_eval, every, rounds = params["eval_samples"], params["eval_every"], params["rounds"]
    out: dict[str, Any] = {"params": params, "rounds": [], "loss": [], "eval_rounds": [], "accuracy": []}
    for rnd in range(rounds):
        x, y = next(stream)
        loss, grad = backend.gradients(x, y)
        backend.apply(grad)
        out["rounds"].append(rnd)
        out["loss"].append(float(loss))
        if (every > 0 and (rnd + 1) % every == 0) or rnd == rounds - 1:
            _, acc = backend.evaluate(data.x_test[:n_eval], data.y_test[:n_eval])
            out["eval_rounds"].append(rnd)
            out["accuracy"].append(float(acc))
    out["final_accuracy"] = out["accuracy"][-1] if out["accuracy"] else None
    if use_cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(cache)
    return out
