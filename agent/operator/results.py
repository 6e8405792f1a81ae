"""Write a job's trained model: named tensors (.npz), an inference .tflite, metrics, .keras.

``model.npz`` holds one array per tensor of the result's layout (names as the model gives
them, e.g. ``w1`` or ``conv1/kernel``) and ``__edgegrove__``, a JSON string saying which model
the tensors are for, so ``edgegrove model evaluate model.npz`` needs no other argument.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.jobs.document import BUILTIN_MODEL, BlobRef, ResultManifest, TensorLayout
from agent.model.contract import F32, Model
from agent.model.loader import load_model
from agent.operator import tflite_writer
from agent.operator.tflite_writer import TfliteWriteError

META_KEY = "__edgegrove__"
SOURCE_DIR = "source"  # the job's own model file, beside the trained one
PROBE_ROWS = 16


class LayoutError(ValueError):
    """The result's layout does not fit its parameters (one line)."""


def named_tensors(params: F32, layout: list[TensorLayout]) -> dict[str, npt.NDArray[np.float32]]:
    """``params`` cut into the layout's tensors, in order."""
    total = sum(math.prod(t.shape) for t in layout)
    if total != params.size:
        raise LayoutError(f"the layout holds {total} values, the parameters {params.size}")
    if len({t.name for t in layout}) != len(layout) or META_KEY in {t.name for t in layout}:
        raise LayoutError("the layout's tensor names are not unique")
    out, at = {}, 0
    for tensor in layout:
        size = math.prod(tensor.shape)
        out[tensor.name] = params[at:at + size].reshape(tensor.shape).copy()
        at += size
    return out


def write_npz(path: Path, params: F32, layout: list[TensorLayout], model_spec: str) -> None:
    arrays: dict[str, Any] = dict(named_tensors(params, layout))
    arrays[META_KEY] = np.array(json.dumps({"model": model_spec, "layout": [
        [t.name, list(t.shape)] for t in layout]}))
    with path.open("wb") as handle:
        np.savez(handle, **arrays)


def read_npz(path: Path) -> tuple[F32, str | None]:
    """The flat parameters of a ``model.npz`` (in its layout's order) and the model it names."""
    with np.load(path, allow_pickle=False) as npz:
        if META_KEY not in npz.files:
            tensors = [np.asarray(npz[k], dtype=np.float32).ravel() for k in npz.files]
            return np.concatenate(tensors), None
        meta = json.loads(str(npz[META_KEY]))
        tensors = [np.asarray(npz[name], dtype=np.float32).ravel() for name, _ in meta["layout"]]
    return np.concatenate(tensors), str(meta["model"])


@dataclass(frozen=True)
class Written:
    files: list[Path]
    notes: list[str]  # what was not written, and why (one line each)


def write_result(out: Path, manifest: ResultManifest, params: F32, blob: bytes | None,
                 keras_source: str | None = None) -> Written:
    """Everything ``job fetch`` writes into ``out`` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    files, notes = [], []
    model_spec = _save_source(out, manifest.model, blob)
    npz = out / "model.npz"
    write_npz(npz, params, manifest.layout, model_spec)
    files.append(npz)
    try:
        tflite = out / "model.tflite"
        tflite.write_bytes(inference_tflite(resolve_spec(out, model_spec), manifest.model, params, blob))
        files.append(tflite)
    except TfliteWriteError as exc:
        notes.append(str(exc))
    if keras_source is not None:
        keras_file = out / "model.keras"
        try:
            write_keras(keras_file, keras_source, manifest.layout, params)
            files.append(keras_file)
        except (ImportError, KerasError) as exc:
            notes.append(f"model.keras not written: {exc}")
    metrics = out / "metrics.json"
    metrics.write_text(json.dumps(_metrics(manifest), indent=1) + "\n")
    files.append(metrics)
    return Written(files, notes)


def _save_source(out: Path, model: str | BlobRef, blob: bytes | None) -> str:
    """The model spec the .npz names, relative to ``out``: a builtin, or the job's file."""
    if isinstance(model, str):
        return model
    assert blob is not None, "a blob model needs its bytes"
    folder = out / SOURCE_DIR
    folder.mkdir(exist_ok=True)
    (folder / model.filename).write_bytes(blob)
    return f"{SOURCE_DIR}/{model.filename}" + ("" if model.is_tflite else f":{model.factory}")


def resolve_spec(base: Path, spec: str) -> str:
    """A model spec from a .npz made absolute against the folder the .npz is in."""
    if spec == BUILTIN_MODEL or not spec.startswith(f"{SOURCE_DIR}/"):
        return spec
    return str(base / spec)


def inference_tflite(model_spec: str, job_model: str | BlobRef, params: F32, blob: bytes | None) -> bytes:
    """The inference .tflite for a job's model (TfliteWriteError when there is none)."""
    if job_model == BUILTIN_MODEL:
        return tflite_writer.mlp_tflite(params)
    if isinstance(job_model, BlobRef) and job_model.is_tflite:
        assert blob is not None
        return tflite_writer.trained_copy(blob, params)
    model: Model = load_model(model_spec)
    probe = np.random.default_rng(0).random((PROBE_ROWS, *model.input_shape), dtype=np.float32)
    return tflite_writer.dense_tflite(model, params, probe)


def _metrics(manifest: ResultManifest) -> dict[str, Any]:
    return {
        "job": manifest.job, "round": manifest.round, "accuracy": manifest.accuracy,
        "loss": manifest.loss, "model_hash": manifest.model_hash, "fingerprint": manifest.fingerprint,
        "params_sha256": manifest.params_sha256, "parameters": manifest.values,
        "published_by": {"device": manifest.device, "node": manifest.node},
        "published_at": manifest.published_at,
        "states": {d: str(s) for d, s in sorted(manifest.states.items())},
        "layout": [[t.name, list(t.shape)] for t in manifest.layout],
    }


class KerasError(ValueError):
    """The Keras source does not take these weights (one line)."""


def write_keras(path: Path, source: str, layout: list[TensorLayout], params: F32) -> None:
    """The Keras model ``source`` names (a .keras file or file.py:function, as for `model
    export`) with the trained weights, saved as ``path``. Needs TensorFlow (ImportError)."""
    from agent.commands.model_export import ExportError, load_keras

    try:
        keras_model = load_keras(source)
    except ExportError as exc:
        raise KerasError(str(exc)) from None
    variables = keras_model.trainable_variables
    tensors = named_tensors(params, layout)
    if [tuple(v.shape) for v in variables] != [tuple(t.shape) for t in layout]:
        raise KerasError(f"{source}: its trainable weights' shapes are not the result's layout")
    for variable, array in zip(variables, tensors.values(), strict=True):
        variable.assign(array)
    keras_model.save(path)

