"""``load_model(spec)``: the model a spec names, checked against the contract.

Specs: ``mlp`` (the thesis MLP), ``pkg.module:factory`` (an installed module),
``path/to/file.py:factory`` (a file), or ``path/to/model.tflite`` (run by LiteRT).
Whatever a user's factory does wrong ends as one ``ModelError`` line, before anything starts.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar, cast

import numpy as np

from agent.model.contract import Model, ModelError, TensorSpec
from agent.validate import one_line

DEFAULT_MODEL = "mlp"
SPEC_HELP = "use mlp, pkg.module:factory, path/to/file.py:factory or a .tflite file"
T = TypeVar("T")
REQUIRED = ("name", "input_shape", "num_classes", "tensors", "param_count",
            "initial_params", "loss_and_grad", "predict")


def load_model(spec: str) -> Model:
    """The model ``spec`` names; ModelError (one line) if it cannot be loaded or breaks the
    contract."""
    spec = spec.strip()
    if spec == DEFAULT_MODEL:
        from agent.model.mlp_model import MlpModel

        return MlpModel()
    if spec.endswith(".tflite"):
        return check_model(_load_tflite(spec), spec)
    where, colon, factory_name = spec.rpartition(":")
    if not colon or not where or not factory_name.isidentifier():
        raise ModelError(f"model {spec!r}: {SPEC_HELP}")
    module = _import_file(where) if where.endswith(".py") else _import_module(where)
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise ModelError(f"model {spec}: {where} has no {factory_name!r}")
    if not callable(factory):
        raise ModelError(f"model {spec}: {factory_name} is not callable (a factory returning the model)")
    try:
        model = factory()
    except Exception as exc:  # the user's code: anything it raises is said in one line
        raise ModelError(f"factory {spec} raised {_said(exc)}") from exc
    return check_model(model, spec)


def _said(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _load_tflite(spec: str) -> Model:
    if not Path(spec).is_file():
        raise ModelError(f"model {spec}: no such file")
    try:
        from agent.model.tflite_model import TfliteModel
    except ImportError as exc:
        if exc.name == "agent.model.tflite_model":
            raise ModelError(f"model {spec}: this edgegrove has no .tflite model support") from exc
        raise ModelError(f"model {spec} is a .tflite file, which needs ai-edge-litert "
                         f"(pip install 'edgegrove[litert]'): {_said(exc)}") from exc
    try:
        return cast(Model, TfliteModel(spec))
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"model {spec}: {_said(exc)}") from exc


def _import_file(path_text: str) -> ModuleType:
    path = Path(path_text)
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    # A name of its own per file: two models from different files never share a module.
    # Its own folder importable, as `python path/to/file.py` would have it: a model split over
    # files next to each other imports its siblings.
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = "edgegrove_user_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ModelError(f"model file {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ModelError(f"importing {path} raised {_said(exc)}") from exc
    return module


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise ModelError(f"model module {name} is not installed (or give a path/to/file.py)") from exc
        raise ModelError(f"importing {name} raised {_said(exc)}") from exc
    except Exception as exc:
        raise ModelError(f"importing {name} raised {_said(exc)}") from exc


def check_model(model: object, spec: str) -> Model:
    """``model`` if it keeps the contract (attributes, consistent shapes, float32 initial
    parameters, one loss/gradient/prediction on a tiny batch); ModelError saying what is
    wrong otherwise."""
    missing = [a for a in REQUIRED if not hasattr(model, a)]
    if missing:
        raise ModelError(f"model {spec} has no {', '.join(missing)} (docs/MODELS.md lists the contract)")
    checked = cast(Model, model)
    _check_attributes(checked, spec)
    params = _call(spec, "initial_params", lambda: checked.initial_params(0))
    _check_vector(params, checked.param_count, spec, "initial_params(0)")
    again = _call(spec, "initial_params", lambda: checked.initial_params(0))
    if not np.array_equal(np.asarray(params), np.asarray(again)):
        raise ModelError(f"model {spec}: initial_params(0) differs between two calls "
                         "(draw the weights from the seed alone, e.g. np.random.default_rng(seed))")
    _probe(checked, np.asarray(params, dtype=np.float32), spec)
    return checked


def _check_attributes(model: Model, spec: str) -> None:
    if not isinstance(model.name, str) or not model.name:
        raise ModelError(f"model {spec}: name must be a non-empty string, got {model.name!r}")
    if not _is_shape(model.input_shape) or len(model.input_shape) == 0:
        raise ModelError(f"model {spec}: input_shape must be a tuple of positive ints (one sample's "
                         f"shape, e.g. (784,) or (28, 28, 1)), got {model.input_shape!r}")
    if not _is_int(model.num_classes) or model.num_classes < 2:
        raise ModelError(f"model {spec}: num_classes must be an int >= 2, got {model.num_classes!r}")
    tensors = model.tensors
    if not isinstance(tensors, (tuple, list)) or not tensors:
        raise ModelError(f"model {spec}: tensors must be a non-empty tuple of TensorSpec(name, shape)")
    for tensor in tensors:
        if not isinstance(tensor, TensorSpec) or not _is_shape(tensor.shape):
            raise ModelError(f"model {spec}: tensors holds {tensor!r}, not a TensorSpec(name, shape) "
                             "with a tuple of positive ints")
    total = sum(t.size for t in tensors)
    if not _is_int(model.param_count) or model.param_count != total:
        raise ModelError(f"model {spec}: param_count is {model.param_count!r} but its tensors hold {total}")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_shape(value: object) -> bool:
    return isinstance(value, tuple) and all(_is_int(d) and int(d) > 0 for d in value)


def _call(spec: str, what: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except ModelError:
        raise
    except Exception as exc:  # the user's code
        raise ModelError(f"model {spec}: {what} raised {_said(exc)}") from exc


def _check_vector(value: object, length: int, spec: str, what: str, dtype_exact: bool = True) -> None:
    if not isinstance(value, np.ndarray):
        raise ModelError(f"model {spec}: {what} returned {type(value).__name__}, not a numpy array")
    if value.shape != (length,):
        raise ModelError(f"model {spec}: {what} has shape {value.shape}, expected ({length},) = param_count")
    if dtype_exact and value.dtype != np.float32:
        raise ModelError(f"model {spec}: {what} is {value.dtype}, expected float32")
    if not np.all(np.isfinite(value)):
        raise ModelError(f"model {spec}: {what} holds NaN or inf")


def _probe(model: Model, params: np.ndarray, spec: str) -> None:
    """One loss, gradient and prediction on two zero samples: wrong shapes fail here, not in
    round 0 of a fleet."""
    x = np.zeros((2, *model.input_shape), dtype=np.float32)
    y = np.array([0, 1], dtype=np.int64)
    result = _call(spec, "loss_and_grad", lambda: model.loss_and_grad(params, x, y))
    if not isinstance(result, tuple) or len(result) != 2:
        raise ModelError(f"model {spec}: loss_and_grad must return (loss, flat gradient)")
    loss, grad = result
    try:
        loss_value = float(loss)
    except (TypeError, ValueError):
        raise ModelError(f"model {spec}: loss_and_grad's loss is {type(loss).__name__}, not a number") from None
    if not np.isfinite(loss_value):
        raise ModelError(f"model {spec}: loss_and_grad returned a non-finite loss ({loss_value}) "
                         "at the initial parameters")
    _check_vector(grad, model.param_count, spec, "loss_and_grad's gradient", dtype_exact=False)
    scores = _call(spec, "predict", lambda: model.predict(params, x))
    if not isinstance(scores, np.ndarray) or scores.shape != (2, model.num_classes):
        shape = scores.shape if isinstance(scores, np.ndarray) else type(scores).__name__
        raise ModelError(f"model {spec}: predict on 2 samples gave {shape}, expected (2, {model.num_classes})")
