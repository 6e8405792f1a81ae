"""The single-machine baseline for a fleet's run of ``model.py``: the same module and initial
weights (``torch.manual_seed(0)``), scikit-learn's digits split as the agents split it, trained
with ``torch.optim.Adam`` (the agent's constants) for the same number of steps on batches of
agents x batch (one step of the fleet averages that many samples' gradients):

    python examples/torch_cnn/torch_baseline.py --agents 7 --batch 16 --rounds 300 --lr 0.003
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np


def _model_file() -> Any:
    spec = importlib.util.spec_from_file_location("edgegrove_torch_cnn", Path(__file__).with_name("model.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    import torch

    from agent.model.datasets import load_digits

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = _model_file()
    torch.manual_seed(0)
    module = spec.build().float().eval()  # as the agents run it
    data = load_digits()
    x = torch.from_numpy(data.x_train.reshape(-1, *spec.INPUT_SHAPE))
    y = torch.from_numpy(data.y_train)
    optimizer = torch.optim.Adam(module.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-7)
    rng = np.random.default_rng(args.seed)
    batch, order, at = args.agents * args.batch, rng.permutation(len(y)), 0
    for _ in range(args.rounds):
        if at + batch > len(order):
            order, at = rng.permutation(len(y)), 0
        rows = torch.from_numpy(order[at:at + batch])
        at += batch
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(x[rows]), y[rows]).backward()
        optimizer.step()
    with torch.no_grad():
        scores = module(torch.from_numpy(data.x_test.reshape(-1, *spec.INPUT_SHAPE)))
    accuracy = float((scores.argmax(1).numpy() == data.y_test).mean())
    print(f"torch single machine: {args.rounds} steps of {args.agents} x {args.batch}, adam lr "
          f"{args.lr}: test accuracy {accuracy:.4f} on {len(data.y_test)} digits")


if __name__ == "__main__":
    main()
