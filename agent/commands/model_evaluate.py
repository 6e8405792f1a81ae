"""`edgegrove model evaluate MODEL --data PATH`: score a trained model on a data path.

MODEL is what `edgegrove job fetch` wrote: ``model.npz`` (named tensors; the model they are for
is named inside it, or give --model) or an inference ``model.tflite`` (run on ai-edge-litert).
The score is taken on the data's test split, as the agents evaluate: its x_test/y_test, else the
--holdout fraction held out with --seed (the fleet's defaults).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.model.contract import F32, ModelError, TensorSpec
from agent.model.data import DataError, to_float_pixels
from agent.model.datasets import DATASETS, DataRequest, load_agent_data
from agent.model.loader import load_model
from agent.operator.results import read_npz, resolve_spec
from agent.operator.tflite_writer import INFER, TfliteWriteError
from agent.validate import arg, existing_path, input_file

DESCRIPTION = __doc__
PROG = "edgegrove model evaluate"
CHUNK = 500

Scorer = Callable[[F32], F32]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trained", type=arg(input_file), help="model.npz, an inference model.tflite, or a model.keras (with TensorFlow)")
    parser.add_argument("--data", type=arg(existing_path), default=None,
                        help="the data: .npz (x, y [, x_test, y_test]), MNIST, a CSV, an image folder")
    parser.add_argument("--dataset", choices=DATASETS, default=None, help="a packaged dataset by name")
    parser.add_argument("--model", default=None,
                        help="for a .npz without its model's name: mlp, file.py:factory or the job's .tflite")
    parser.add_argument("--label-column", default="label", help="the CSV column holding the labels")
    parser.add_argument("--holdout", type=float, default=0.1, help="held-out fraction when the data has no test split")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the held-out choice (the job's seed)")
    parser.add_argument("--limit", type=int, default=0, help="score the first N test samples only (0: all)")
    parser.add_argument("--json", action="store_true", help="print JSON")


@dataclass(frozen=True)
class Shape:
    """What the data loader needs of a model: the sample's shape and the classes."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    tensors: tuple[TensorSpec, ...] = ()


def run(args: argparse.Namespace) -> int:
    try:
        if (args.data is None) == (args.dataset is None):
            raise ValueError("give --data PATH or --dataset NAME (one)")
        shape, scorer = load_trained(Path(args.trained), args.model)
        request = DataRequest(path=Path(args.data) if args.data else None, dataset=args.dataset,
                              label_column=args.label_column, holdout=args.holdout, seed=args.seed)
        data = load_agent_data(request, 0, 1, shape)  # type: ignore[arg-type]
        x, y = data.x_test, data.y_test
        if args.limit > 0:
            x, y = x[:args.limit], y[:args.limit]
        if len(y) == 0:
            raise DataError(f"{data.source}: no test samples")
        accuracy = score(scorer, x, y)
    except (ModelError, DataError, TfliteWriteError, ValueError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"model": str(args.trained), "data": data.source, "samples": len(y),
                          "accuracy": accuracy}))
    else:
        print(f"{args.trained}: accuracy {accuracy:.4f} on {len(y):,} test samples of {data.source}")
    return 0


def score(scorer: Scorer, x: np.ndarray, y: np.ndarray) -> float:
    correct = 0
    for start in range(0, len(y), CHUNK):
        scores = scorer(to_float_pixels(x[start:start + CHUNK]))
        correct += int(np.sum(np.argmax(scores, axis=1) == y[start:start + CHUNK]))
    return correct / len(y)


def load_trained(path: Path, model_spec: str | None) -> tuple[Shape, Scorer]:
    if path.suffix == ".npz":
        return _npz(path, model_spec)
    if path.suffix == ".tflite":
        return _tflite(path)
    if path.suffix == ".keras":
        return _keras(path)
    raise ValueError(f"{path}: give a model.npz, a model.tflite or a model.keras")


def _npz(path: Path, model_spec: str | None) -> tuple[Shape, Scorer]:
    try:
        params, named = read_npz(path)
    except (ValueError, KeyError) as exc:
        raise ModelError(f"{path} is not a model.npz of `edgegrove job fetch`: {exc}") from None
    spec = model_spec or (resolve_spec(path.parent, named) if named else None)
    if spec is None:
        raise ModelError(f"{path} does not name its model: give --model")
    model = load_model(spec)
    if params.size != model.param_count:
        raise ModelError(f"{path} holds {params.size} values, model {model.name} takes {model.param_count}")
    return (Shape(model.name, tuple(model.input_shape), model.num_classes),
            lambda x: np.asarray(model.predict(params, x), dtype=np.float32))


def _tflite(path: Path) -> tuple[Shape, Scorer]:
    from ai_edge_litert.interpreter import Interpreter

    try:
        interpreter = Interpreter(model_path=str(path))
        runner = interpreter.get_signature_runner(INFER)
    except Exception as exc:
        raise ModelError(f"{path}: not a .tflite with an {INFER} signature ({exc})") from None
    inputs, outputs = runner.get_input_details(), runner.get_output_details()
    if set(inputs) != {"x"}:
        raise ModelError(f"{path}: its {INFER} takes {', '.join(inputs)}, not x alone: "
                         "give the model.tflite of `edgegrove job fetch`")
    sample = tuple(int(d) for d in inputs["x"]["shape"][1:])
    classes = int(next(iter(outputs.values()))["shape"][-1])

    def scores(x: F32) -> F32:
        return np.asarray(next(iter(runner(x=np.ascontiguousarray(x, dtype=np.float32)).values())),
                          dtype=np.float32)

    return Shape(path.stem, sample, classes), scores


def _keras(path: Path) -> tuple[Shape, Scorer]:
    """A .keras of `job fetch --keras` (needs TensorFlow, as `model export` does)."""
    try:
        import keras
    except ImportError:
        raise ModelError("a .keras model needs TensorFlow: pip install 'edgegrove[export]'") from None
    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as exc:  # the user's file: one line whatever it raises
        raise ModelError(f"{path} cannot be loaded: {type(exc).__name__}: {exc}") from None
    sample = tuple(int(d) for d in model.inputs[0].shape[1:])
    classes = int(model.outputs[0].shape[-1])
    return (Shape(path.stem, sample, classes),
            lambda x: np.asarray(model.predict(x, verbose=0, batch_size=CHUNK), dtype=np.float32))
