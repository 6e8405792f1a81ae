"""What `job fetch` writes from a result: named tensors, the .tflite, metrics; hash checks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from agent.jobs.document import BlobRef, ResultManifest, TensorLayout
from agent.jobs.states import ExecState
from agent.model.flat import params_hash
from agent.model.loader import load_model
from agent.operator.blobs import ResultError, assemble, blob_ref, cut
from agent.operator.results import LayoutError, named_tensors, read_npz, write_result
from agent.operator.tflite_writer import run_infer

REPO = Path(__file__).resolve().parents[3]
CHUNK = 64 * 1024


def manifest_for(params: np.ndarray, model: str | BlobRef, layout: list[TensorLayout]) -> ResultManifest:
    data = params.astype("<f4").tobytes()
    return ResultManifest(
        job="j", device="pi-a", node=0, round=40, accuracy=0.91, loss=0.3, model=model,
        model_hash=f"{params_hash(params):08x}", fingerprint="f" * 16,
        params_sha256=hashlib.sha256(data).hexdigest(), values=params.size, chunk_size=CHUNK,
        chunks=len(cut(data, CHUNK)), layout=layout, states={"pi-a": ExecState.SUCCEEDED}, published_at=1.0)


def layout_of(spec: str) -> list[TensorLayout]:
    return [TensorLayout(name=t.name, shape=list(t.shape)) for t in load_model(spec).tensors]


def test_chunks_are_assembled_only_whole_and_with_the_manifests_hash() -> None:
    params = np.arange(40000, dtype=np.float32)
    manifest = manifest_for(params, "mlp", [])
    chunks = dict(enumerate(cut(params.astype("<f4").tobytes(), CHUNK)))
    assert np.array_equal(assemble(manifest, chunks), params)
    with pytest.raises(ResultError, match="chunks missing"):
        assemble(manifest, {0: chunks[0]})
    forged = dict(chunks)
    forged[1] = bytes(len(chunks[1]))
    with pytest.raises(ResultError, match="sha256"):
        assemble(manifest, forged)


def test_named_tensors_follow_the_layout_and_refuse_one_that_does_not_fit() -> None:
    layout = [TensorLayout(name="w", shape=[2, 3]), TensorLayout(name="b", shape=[3])]
    tensors = named_tensors(np.arange(9, dtype=np.float32), layout)
    assert tensors["w"].tolist() == [[0, 1, 2], [3, 4, 5]] and tensors["b"].tolist() == [6, 7, 8]
    with pytest.raises(LayoutError):
        named_tensors(np.arange(10, dtype=np.float32), layout)


def test_the_thesis_mlp_result_is_written_as_npz_tflite_and_metrics(tmp_path: Path) -> None:
    model = load_model("mlp")
    params = (model.initial_params(0) * 1.5).astype(np.float32)
    written = write_result(tmp_path, manifest_for(params, "mlp", layout_of("mlp")), params, None)
    assert {f.name for f in written.files} == {"model.npz", "model.tflite", "metrics.json"}
    assert written.notes == []
    with np.load(tmp_path / "model.npz") as npz:
        assert npz["w1"].shape == (784, 512) and npz["b2"].shape == (10,)
    flat, spec = read_npz(tmp_path / "model.npz")
    assert spec == "mlp" and np.array_equal(flat, params)
    x = np.random.default_rng(0).random((8, 784), dtype=np.float32)
    np.testing.assert_allclose(run_infer((tmp_path / "model.tflite").read_bytes(), x),
                               model.predict(params, x), rtol=1e-5, atol=1e-5)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert (metrics["round"], metrics["accuracy"], metrics["states"]) == (40, 0.91, {"pi-a": "succeeded"})


def test_a_tflite_jobs_result_keeps_the_source_file_and_names_it_in_the_npz(tmp_path: Path) -> None:
    cnn = REPO / "examples" / "mnist_cnn" / "mnist_cnn.tflite"
    ref, blob = blob_ref(cnn)
    model = load_model(str(cnn))
    params = (model.initial_params(0) * 0.5).astype(np.float32)
    written = write_result(tmp_path, manifest_for(params, ref, layout_of(str(cnn))), params, blob)
    assert (tmp_path / "source" / "mnist_cnn.tflite").read_bytes() == blob
    assert read_npz(tmp_path / "model.npz")[1] == "source/mnist_cnn.tflite"
    x = np.random.default_rng(1).random((6, 28, 28, 1), dtype=np.float32)
    np.testing.assert_allclose(run_infer((tmp_path / "model.tflite").read_bytes(), x),
                               model.predict(params, x), rtol=1e-5, atol=1e-5)
    assert {f.name for f in written.files} >= {"model.npz", "model.tflite"}


def test_a_python_models_result_names_its_factory(tmp_path: Path) -> None:
    source = REPO / "examples" / "digits" / "model.py"
    ref, blob = blob_ref(source)
    params = load_model(f"{source}:factory").initial_params(0)
    write_result(tmp_path, manifest_for(params, ref, layout_of(f"{source}:factory")), params, blob)
    assert read_npz(tmp_path / "model.npz")[1] == "source/model.py:factory"
    assert (tmp_path / "model.tflite").is_file()


def test_the_keras_model_the_tflite_came_from_takes_the_trained_weights(tmp_path: Path) -> None:
    import keras

    from agent.operator.results import KerasError, write_keras

    cnn = REPO / "examples" / "mnist_cnn" / "mnist_cnn.tflite"
    model = load_model(str(cnn))
    params = (model.initial_params(0) * 0.5).astype(np.float32)
    out = tmp_path / "model.keras"
    write_keras(out, f"{REPO / 'examples' / 'mnist_cnn' / 'build.py'}:build_model", layout_of(str(cnn)), params)
    x = np.random.default_rng(2).random((6, 28, 28, 1), dtype=np.float32)
    np.testing.assert_allclose(keras.models.load_model(out, compile=False).predict(x, verbose=0),
                               model.predict(params, x), rtol=1e-4, atol=1e-5)
    with pytest.raises(KerasError, match="layout"):
        write_keras(out, f"{REPO / 'examples' / 'mnist_cnn' / 'build.py'}:build_model",
                    [TensorLayout(name="w", shape=[int(params.size)])], params)
