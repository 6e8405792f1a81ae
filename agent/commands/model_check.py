"""`edgegrove model check`: load a model as an agent would and show what the fleet will train.

Prints the parameter count and tensors, the input and label shapes, the .tflite signatures
(when the model has them), the loss and gradient on one batch (of --data/--dataset when given,
else of seeded random inputs) and the model's fingerprint. Whatever is wrong is one line on
stderr and exit 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from agent.model.contract import Model, ModelError, fingerprint
from agent.model.data import DataError, Dataset, to_float_pixels
from agent.model.datasets import DATASETS, DataRequest, load_agent_data
from agent.model.loader import load_model
from agent.model.partition import label_histogram
from agent.validate import arg, existing_path

DESCRIPTION = __doc__
PROG = "edgegrove model check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="mlp, pkg.module:factory, path/to/file.py:factory or a .tflite file")
    parser.add_argument("--data", type=arg(existing_path), default=None,
                        help=".npz (x, y [, x_test, y_test]), a CSV with a label column, or a folder "
                             "with one subfolder of images per class")
    parser.add_argument("--dataset", choices=DATASETS, default=None, help="a packaged dataset by name")
    parser.add_argument("--label-column", default="label", help="the CSV column holding the labels")
    parser.add_argument("--holdout", type=float, default=0.1,
                        help="fraction held out for evaluation when the data has no test split")
    parser.add_argument("--batch", type=int, default=32, help="samples in the gradient's batch")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights (and the fingerprint)")


def run(args: argparse.Namespace) -> int:
    try:
        _check_args(args)
        model = load_model(args.model)
        data = _data(args, model)
        _report(args, model, data)
    except (ModelError, DataError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    return 0


def _check_args(args: argparse.Namespace) -> None:
    if args.data is not None and args.dataset is not None:
        raise ValueError("give --data or --dataset, not both")
    if args.batch < 1:
        raise ValueError("--batch must be at least 1")
    if not 0 <= args.holdout < 1:
        raise ValueError("--holdout must be in [0, 1)")
    if args.seed < 0:
        raise ValueError("--seed must be >= 0")


def _data(args: argparse.Namespace, model: Model) -> Dataset | None:
    if args.data is None and args.dataset is None:
        return None
    request = DataRequest(path=Path(args.data) if args.data else None, dataset=args.dataset,
                          label_column=args.label_column, holdout=args.holdout, seed=args.seed)
    return load_agent_data(request, 0, 1, model)


def _batch(model: Model, data: Dataset | None, size: int, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    if data is not None:
        n = min(size, len(data.y_train))
        return to_float_pixels(data.x_train[:n]), data.y_train[:n], f"the first {n} training samples"
    rng = np.random.default_rng(seed)
    x = rng.random((size, *model.input_shape), dtype=np.float32)
    y = np.arange(size, dtype=np.int64) % model.num_classes
    return x, y, f"{size} random samples"


def _report(args: argparse.Namespace, model: Model, data: Dataset | None) -> None:
    out = sys.stdout
    print(f"model        {model.name}  ({args.model})", file=out)
    print(f"parameters   {model.param_count:,} in {len(model.tensors)} tensors", file=out)
    width = max(len(t.name) for t in model.tensors)
    for tensor in model.tensors:
        print(f"  {tensor.name.ljust(width)}  {tensor.shape!s:<16} {tensor.size:,}", file=out)
    print(f"input        {tuple(model.input_shape)} float32 per sample", file=out)
    print(f"labels       int in [0, {model.num_classes})", file=out)
    signatures = getattr(model, "signatures", None)
    if signatures:
        print(f"signatures   {', '.join(str(s) for s in signatures)}", file=out)
    if data is not None:
        print(f"data         {data.source}: {len(data.y_train):,} training samples {tuple(data.x_train.shape[1:])}, "
              f"{len(data.y_test):,} test samples", file=out)
        print(f"  labels     {label_histogram(data.y_train, model.num_classes)}", file=out)
    params = model.initial_params(args.seed)
    x, y, what = _batch(model, data, args.batch, args.seed)
    loss, grad = model.loss_and_grad(params, x, y)
    grad64 = np.asarray(grad, dtype=np.float64)
    finite = math.isfinite(float(loss)) and bool(np.all(np.isfinite(grad64)))
    norm = float(np.sqrt(np.sum(grad64 * grad64))) if finite else float("nan")
    print(f"gradient     on {what}: loss {float(loss):.4f}, |grad| {norm:.4g}, "
          f"{'finite' if finite else 'NOT FINITE'}", file=out)
    if not finite:
        raise ModelError(f"model {model.name} gives a non-finite loss or gradient on {what}: "
                         "a fleet would stop it")
    print(f"fingerprint  {fingerprint(model, args.seed)} (seed {args.seed})", file=out)
