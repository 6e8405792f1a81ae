"""`edgegrove model export SOURCE -o model.tflite`: a Keras model as the stateless `.tflite`
the agent trains (docs/MODELS.md, "LiteRT").

SOURCE is a `.keras` file or `file.py:function` returning a Keras model. The file's
signatures take the parameters as one flat float32 vector, so the interpreter holds no
training state and the agent keeps the optimizer:
  gradients(params [P], x [B, ...], y [B] int32) -> loss [], grad [P]
  infer(params [P], x [B, ...])                  -> scores [B, classes]
  initial_weights()                              -> params [P]
  metadata()                                     -> json [n] uint8 (name, tensors, classes)
B is dynamic: one file serves any batch. ``--batch-norm train`` runs batch norm on each batch's
statistics in ``gradients`` and carries the moving statistics in the vector (running tensors,
named in the metadata). Recurrent layers are unrolled over the known sequence length. Builtin
LiteRT ops only (a device's ai-edge-litert
has no TF-Select kernels). Runs on a workstation with TensorFlow (`pip install
'edgegrove[export]'`); a device never imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from agent.validate import one_line

DESCRIPTION = __doc__
NO_TF = "model export needs TensorFlow: pip install 'edgegrove[export]'"
METADATA_FORMAT = 1
SIGNATURES = ("gradients", "infer", "initial_weights", "metadata")
BATCH_NORM_MODES = ("frozen", "train")


class ExportError(Exception):
    """What is wrong with the source model, one line, said to the user (exit 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a .keras file, or file.py:function returning a Keras model")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the .tflite to write")
    parser.add_argument("--name", default=None, help="the model's name (default: the Keras model's)")
    parser.add_argument(
        "--batch-norm", choices=BATCH_NORM_MODES, default="frozen",
        help="frozen: batch norm runs on its exported statistics (fine-tuning); train: on each "
             "batch's statistics while training, its running statistics carried in the parameter "
             "vector and averaged by the fleet (training from scratch)")


def run(args: argparse.Namespace) -> int:
    if args.output.suffix != ".tflite":
        print(f"model export: -o must name a .tflite file, got {args.output}", file=sys.stderr)
        return 2
    problem = _source_problem(args.source)
    if problem is not None:
        print(f"model export: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        # Its import prints oneDNN notices through absl on some CPUs, whatever the log level.
        with _native_stderr_silenced():
            import tensorflow  # noqa: F401 - only to say what is missing before anything starts
    except ImportError:
        print(NO_TF, file=sys.stderr)
        return 2
    try:
        model = load_keras(args.source)
        data = export(model, name=args.name, batch_norm=args.batch_norm)
    except ExportError as exc:
        print(f"model export: {one_line(str(exc))}", file=sys.stderr)
        return 2
    args.output.write_bytes(data)
    meta = json.loads(_metadata_json(model, args.name, Layout(model, args.batch_norm)))
    params = sum(int(np.prod(shape)) for _, shape in meta["tensors"])
    running = sum(int(np.prod(shape)) for n, shape in meta["tensors"] if n in meta.get("running", ()))
    held = f" ({running:,} of them batch-norm running statistics)" if running else ""
    print(f"wrote {args.output}: {meta['name']}, {params:,} parameters{held}, input "
          f"{tuple(meta['input_shape'])}, {meta['num_classes']} classes, {len(data):,} bytes, "
          f"signatures {', '.join(SIGNATURES)}")
    return 0


def _source_problem(source: str) -> str | None:
    """What is wrong with ``source`` as written (before TensorFlow is imported), or None."""
    if source.endswith(".keras"):
        return None if Path(source).is_file() else f"{source}: no such file"
    path_text, colon, function = source.rpartition(":")
    if not colon or not path_text.endswith(".py") or not function.isidentifier():
        return f"source {source!r}: give a .keras file or path/to/file.py:function"
    return None if Path(path_text).is_file() else f"{path_text}: no such file"


def load_keras(source: str) -> Any:
    """The Keras model ``source`` names (a .keras file or file.py:function)."""
    import keras

    problem = _source_problem(source)
    if problem is not None:
        raise ExportError(problem)
    if source.endswith(".keras"):
        try:
            return _checked(keras.models.load_model(source, compile=False), source)
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"{source} cannot be loaded: {type(exc).__name__}: {exc}") from exc
    path_text, _, function = source.rpartition(":")
    module = _import_file(Path(path_text))
    build = getattr(module, function, None)
    if not callable(build):
        raise ExportError(f"{path_text} has no function {function!r}")
    try:
        built = build()
    except Exception as exc:  # the user's code
        raise ExportError(f"{source} raised {type(exc).__name__}: {exc}") from exc
    return _checked(built, source)


def _import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"edgegrove_export_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ExportError(f"{path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look their module up there
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code
        sys.modules.pop(spec.name, None)
        raise ExportError(f"importing {path} raised {type(exc).__name__}: {exc}") from exc
    return module


def _checked(model: Any, source: str) -> Any:
    import keras

    if not isinstance(model, keras.Model):
        raise ExportError(f"{source} gave a {type(model).__name__}, not a Keras model")
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ExportError(f"{source}: the model must have one input and one output")
    shape = tuple(model.inputs[0].shape[1:])
    if not shape or any(d is None for d in shape):
        raise ExportError(f"{source}: the input's sample shape must be fully known, got {shape}")
    out = tuple(model.outputs[0].shape[1:])
    if len(out) != 1 or out[0] is None or out[0] < 2:
        raise ExportError(f"{source}: the output must be [batch, classes] with classes >= 2, got {out}")
    if not model.trainable_variables:
        raise ExportError(f"{source}: the model has no trainable weights")
    return model


def _probabilities(model: Any) -> bool:
    """Whether the model's output is already softmax probabilities (not logits)."""
    activation = getattr(model.layers[-1], "activation", None) if model.layers else None
    return getattr(activation, "__name__", "") == "softmax"


class Layout:
    """The flat parameter vector's variables: the trainable ones in Keras's order, then (with
    ``--batch-norm train``) the moving mean and variance of every trainable batch norm, which
    the gradient signature moves by their running-average step."""

    def __init__(self, model: Any, batch_norm: str) -> None:
        import keras

        norms = [layer for layer in model._flatten_layers()
                 if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable]
        wanted = ({id(v) for layer in norms for v in (layer.moving_mean, layer.moving_variance)}
                  if batch_norm == "train" else set())
        self.trainable = list(model.trainable_variables)
        self.non_trainable = list(model.non_trainable_variables)
        self.running_at = [n for n, v in enumerate(self.non_trainable) if id(v) in wanted]
        self.variables = [*self.trainable, *(self.non_trainable[n] for n in self.running_at)]
        self.shapes = [tuple(int(d) for d in v.shape) for v in self.variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]

    @property
    def running(self) -> bool:
        return bool(self.running_at)


def _metadata_json(model: Any, name: str | None, layout: Layout) -> str:
    names = [_tensor_name(v.path, model.name) for v in layout.variables]
    meta = {
        "format": METADATA_FORMAT,
        "name": name or model.name,
        "input_shape": [int(d) for d in model.inputs[0].shape[1:]],
        "num_classes": int(model.outputs[0].shape[-1]),
        "tensors": [[n, list(s)] for n, s in zip(names, layout.shapes, strict=True)],
        "outputs": "probabilities" if _probabilities(model) else "logits",
    }
    if layout.running:
        meta["running"] = names[len(layout.trainable):]
    return json.dumps(meta, separators=(",", ":"))


def _tensor_name(path: str, model_name: str) -> str:
    """A variable's path without the model's own name in front ("conv1/kernel")."""
    return path.removeprefix(f"{model_name}/")


def _module(model: Any, name: str | None, batch_norm: str = "frozen") -> Any:
    """A tf.Module whose tf.functions are the file's signatures."""
    import tensorflow as tf

    layout = Layout(model, batch_norm)
    trained = len(layout.trainable)
    frozen = [tf.constant(v.numpy()) for v in layout.non_trainable]
    initial = np.concatenate([np.asarray(v.numpy(), np.float32).ravel() for v in layout.variables])
    meta = np.frombuffer(_metadata_json(model, name, layout).encode(), dtype=np.uint8)
    sample = [int(d) for d in model.inputs[0].shape[1:]]
    classes = int(model.outputs[0].shape[-1])
    params_spec = tf.TensorSpec([sum(layout.sizes)], tf.float32, name="params")
    x_spec = tf.TensorSpec([None, *sample], tf.float32, name="x")
    y_spec = tf.TensorSpec([None], tf.int32, name="y")

    def call(params: Any, x: Any, training: bool) -> tuple[Any, Any]:
        """Scores, and the running statistics' steps (new - old) in training mode."""
        parts = [tf.reshape(p, s) for p, s in
                 zip(tf.split(params, layout.sizes), layout.shapes, strict=True)]
        state = list(frozen)
        for n, at in enumerate(layout.running_at):
            state[at] = parts[trained + n]
        scores, updated = model.stateless_call(parts[:trained], state, x, training=training)
        steps = [tf.reshape(updated[at] - state[at], [-1]) for at in layout.running_at]
        return scores, steps

    def forward(params: Any, x: Any) -> Any:
        return call(params, x, training=False)[0]

    cross_entropy = _cross_entropy(_probabilities(model))

    class Exported(tf.Module):
        @tf.function(input_signature=[params_spec, x_spec, y_spec])
        def gradients(self, params: Any, x: Any, y: Any) -> dict[str, Any]:
            with tf.GradientTape() as tape:
                tape.watch(params)
                scores, steps = call(params, x, training=layout.running)
                loss = cross_entropy(scores, tf.one_hot(y, classes))
            grad = tape.gradient(loss, params)
            if steps:  # the running statistics' places hold their steps, not a gradient
                grad = tf.concat([grad[:sum(layout.sizes[:trained])], *steps], axis=0)
            return {"loss": loss, "grad": grad}

        @tf.function(input_signature=[params_spec, x_spec])
        def infer(self, params: Any, x: Any) -> dict[str, Any]:
            return {"scores": forward(params, x)}

        @tf.function(input_signature=[])
        def initial_weights(self) -> dict[str, Any]:
            return {"params": tf.constant(initial)}

        @tf.function(input_signature=[])
        def metadata(self) -> dict[str, Any]:
            return {"json": tf.constant(meta)}

    return Exported()


def _cross_entropy(probabilities: bool) -> Any:
    """The mean cross-entropy of scores (probabilities or logits) against one-hot labels."""
    import tensorflow as tf

    @tf.custom_gradient
    def cross_entropy(scores: Any, onehot: Any) -> Any:
        """Mean cross-entropy with its gradient written out: TensorFlow's own would broadcast
        over the dynamic batch (BroadcastGradientArgs, no builtin kernel)."""
        batch = tf.cast(tf.shape(scores)[0], tf.float32)
        if probabilities:
            clipped = tf.maximum(scores, 1e-7)
            loss = -tf.reduce_sum(tf.math.log(clipped) * onehot) / batch
            return loss, lambda up: (up * (-onehot / clipped) / batch, None)
        log_probs = tf.nn.log_softmax(scores)
        loss = -tf.reduce_sum(log_probs * onehot) / batch
        return loss, lambda up: (up * (tf.exp(log_probs) - onehot) / batch, None)

    return cross_entropy


def export(model: Any, name: str | None = None, batch_norm: str = "frozen") -> bytes:
    """The `.tflite` bytes of ``model`` (builtin ops only); ExportError names the ops that have
    no builtin kernel. ``batch_norm``: "frozen" or "train" (``--batch-norm``)."""
    import tensorflow as tf

    from agent.commands.tf_gradients import builtin_gradients

    if batch_norm not in BATCH_NORM_MODES:
        raise ExportError(f"batch_norm must be one of {', '.join(BATCH_NORM_MODES)}, not {batch_norm!r}")
    module = _module(model, name, batch_norm)
    with (builtin_gradients(), _recurrent_unrolled(model), _dropout_off(model),
          tempfile.TemporaryDirectory() as tmp):
        try:
            signatures = {key: getattr(module, key).get_concrete_function() for key in SIGNATURES}
            tf.saved_model.save(module, tmp, signatures=signatures)
        except Exception as exc:  # the user's layers, traced
            raise ExportError(f"tracing the model failed: {type(exc).__name__}: {exc}") from exc
        converter = tf.lite.TFLiteConverter.from_saved_model(tmp, signature_keys=list(SIGNATURES))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        try:
            with _native_stderr_silenced():
                return bytes(converter.convert())
        except Exception as exc:
            raise ExportError(_conversion_failure(str(exc))) from exc


@contextmanager
def _recurrent_unrolled(model: Any) -> Iterator[None]:
    """Recurrent layers (LSTM, GRU, SimpleRNN) unrolled over the input's known sequence length
    while the model is traced: one step's matrix products and activations per time step.
    Rolled, Keras runs them as a TensorFlow while-loop over tensor lists, whose training graph
    has no builtin kernels. Each layer's own setting is restored after."""
    import keras

    recurrent = [layer for layer in model._flatten_layers()
                 if isinstance(layer, keras.layers.RNN) and not layer.unroll]
    try:
        for layer in recurrent:
            layer.unroll = True
        yield
    finally:
        for layer in recurrent:
            layer.unroll = False


@contextmanager
def _dropout_off(model: Any) -> Iterator[None]:
    """Dropout layers pass their input through while traced: the gradient of ``--batch-norm
    train`` runs the model in training mode (for batch norm's sake), and the file is
    deterministic (no random ops; every agent of a fleet computes the same function)."""
    import keras

    dropouts = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dropout)]
    rates = [layer.rate for layer in dropouts]
    try:
        for layer in dropouts:
            layer.rate = 0.0
        yield
    finally:
        for layer, rate in zip(dropouts, rates, strict=True):
            layer.rate = rate


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """TensorFlow's C++ code prints to file descriptor 2 (the converter's diagnostics: the
    exception carries the same text, said here in one line)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _conversion_failure(text: str) -> str:
    import re

    if "tensor list ops" in text:  # a loop the exporter does not unroll
        return ("the model runs a TensorFlow while-loop (tf.while_loop, tf.scan or a layer looping "
                "over time), whose gradient has no LiteRT builtin kernels: write it as a Keras "
                "LSTM, GRU, SimpleRNN or ConvLSTM layer (export unrolls those over the known "
                "sequence length) or as Conv1D over the sequence")
    ops = sorted(set(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", text)))
    if ops:
        return (f"these TensorFlow ops have no LiteRT builtin kernel: {', '.join(ops)} "
                "(docs/MODELS.md lists the layers export supports)")
    return f"the TFLite converter failed: {text.strip().splitlines()[-1] if text.strip() else '?'}"
