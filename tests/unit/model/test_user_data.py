"""A device's own data (.npz, CSV, image folder), the held-out split, and fitting it to a model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.model.contract import TensorSpec
from agent.model.data import DataError, Dataset
from agent.model.datasets import DataRequest, fit_to_model, load_agent_data, with_holdout
from agent.model.mlp_model import MlpModel
from agent.model.user_data import load_csv, load_image_folder, load_npz, load_user_data
from examples.digits.model import DigitsMLP


class ImageModel(DigitsMLP):
    """The digits network taking 8x8x1 images."""

    input_shape = (8, 8, 1)


class ThreeClasses(DigitsMLP):
    num_classes = 3
    tensors = (*DigitsMLP.tensors[:2], TensorSpec("logits/kernel", (128, 3)), TensorSpec("logits/bias", (3,)))


def one_line_error(call, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError) as info:
        call(*args)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_npz_with_and_without_test_split(tmp_path: Path) -> None:
    x = np.arange(40, dtype=np.uint8).reshape(10, 4)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(10) % 3)
    data = load_npz(tmp_path / "a.npz")
    assert data.x_train.dtype == np.float32 and data.x_train[1, 0] == pytest.approx(4 / 255)
    assert len(data.y_test) == 0 and data.x_test.shape == (0, 4)
    np.savez(tmp_path / "b.npz", x=x, y=np.arange(10) % 3, x_test=x[:2], y_test=[0, 1])
    assert load_npz(tmp_path / "b.npz").y_test.tolist() == [0, 1]


@pytest.mark.parametrize(("arrays", "expected"), [
    ({"a": np.zeros((2, 2))}, "needs arrays x and y"),
    ({"x": np.zeros((3, 2)), "y": np.zeros(2)}, "differ in length"),
    ({"x": np.zeros((3, 2)), "y": np.array([0.5, 1, 2])}, "labels must be integers"),
    ({"x": np.zeros((3, 2)), "y": np.zeros(3), "x_test": np.zeros((1, 2))}, "only one of x_test and y_test"),
    ({"x": np.full((3, 2), np.nan), "y": np.zeros(3)}, "NaN or inf"),
])
def test_npz_errors(tmp_path: Path, arrays: dict[str, np.ndarray], expected: str) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)  # type: ignore[arg-type]
    assert expected in one_line_error(load_npz, tmp_path / "bad.npz")


def test_csv_with_a_label_column(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("f1,kind,f2\n0.5,1,2\n1.5,0,-3\n\n")
    data = load_csv(path, "kind")
    assert data.x_train.tolist() == [[0.5, 2.0], [1.5, -3.0]] and data.y_train.tolist() == [1, 0]
    assert "no label column 'label' (columns: f1, kind, f2)" in one_line_error(load_csv, path, "label")
    path.write_text("f1,label\nabc,1\n")
    assert "d.csv:2: column 'f1' holds 'abc', not a number" in one_line_error(load_csv, path, "label")
    path.write_text("f1,label\n1,cat\n")
    assert "label 'cat'" in one_line_error(load_csv, path, "label")
    path.write_text("f1,label\n1,2,3\n")
    assert "3 values, the header has 2" in one_line_error(load_csv, path, "label")


def test_image_folder_one_subfolder_per_class(tmp_path: Path) -> None:
    from PIL import Image

    for label in ("0", "1", "2"):
        (tmp_path / label).mkdir()
        for i in range(2):
            pixels = np.full((16, 16), 40 * int(label) + i, dtype=np.uint8)
            Image.fromarray(pixels).convert("RGB").save(tmp_path / label / f"{i}.png")
    (tmp_path / "2" / "notes.txt").write_text("not an image")
    data = load_image_folder(tmp_path, (8, 8, 1))
    assert data.x_train.shape == (6, 8, 8, 1) and data.y_train.tolist() == [0, 0, 1, 1, 2, 2]
    assert data.x_train[4, 0, 0, 0] == pytest.approx(80 / 255, abs=1e-6)
    flat = load_user_data(tmp_path, (64,))
    assert flat.x_train.shape == (6, 64)
    (tmp_path / "2" / "broken.png").write_bytes(b"not a png")
    assert "cannot read image" in one_line_error(load_image_folder, tmp_path, (8, 8, 1))


def test_image_folder_needs_class_folders(tmp_path: Path) -> None:
    assert "one subfolder per class" in one_line_error(load_image_folder, tmp_path, (8, 8))


def test_named_class_folders_are_sorted(tmp_path: Path) -> None:
    from PIL import Image

    for name in ("dog", "cat"):
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / name / "a.png")
    assert load_image_folder(tmp_path, (4, 4)).y_train.tolist() == [0, 1]  # cat, dog


def test_holdout_is_seeded_and_disjoint() -> None:
    data = Dataset(np.arange(100, dtype=np.float32).reshape(100, 1), np.arange(100) % 10,
                   np.zeros((0, 1), np.float32), np.zeros(0, np.int64), source="s")
    held = with_holdout(data, 0.2, seed=3)
    assert len(held.y_test) == 20 and len(held.y_train) == 80
    assert not set(held.x_test[:, 0]) & set(held.x_train[:, 0])
    assert np.array_equal(with_holdout(data, 0.2, seed=3).x_test, held.x_test)
    assert with_holdout(held, 0.5, seed=3) is held  # a test split exists: kept


def test_fit_to_model_reshapes_when_sizes_agree_and_checks_labels() -> None:
    flat = Dataset(np.zeros((3, 64), np.float32), np.array([0, 9, 2]), np.zeros((1, 64), np.float32),
                   np.array([1]), source="mine")
    assert fit_to_model(flat, ImageModel()).x_train.shape == (3, 8, 8, 1)
    images = Dataset(np.zeros((3, 8, 8, 1), np.float32), np.array([0, 1, 2]),
                     np.zeros((0, 8, 8, 1), np.float32), np.zeros(0, np.int64), source="mine")
    assert fit_to_model(images, DigitsMLP()).x_train.shape == (3, 64)
    assert one_line_error(fit_to_model, flat, MlpModel()) == (
        "mine: samples have shape (64,) (64 values) but model mlp takes (784,) (784 values)")
    assert one_line_error(fit_to_model, flat, ThreeClasses()) == (
        "mine: labels span 0..9 but model digits-mlp has 3 classes (labels must be 0..2)")


def test_agent_data_from_a_users_csv_is_held_out_and_partitioned(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = ["label," + ",".join(f"p{i}" for i in range(64))]
    rows += [f"{i % 10}," + ",".join(str(v) for v in rng.random(64).round(3)) for i in range(200)]
    (tmp_path / "mine.csv").write_text("\n".join(rows) + "\n")
    request = DataRequest(path=tmp_path / "mine.csv", holdout=0.25, partition="dirichlet:1", seed=2)
    parts = [load_agent_data(request, i, 4, DigitsMLP()) for i in range(4)]
    assert sum(len(p.y_train) for p in parts) == 150
    assert all(len(p.y_test) == 50 and np.array_equal(p.y_test, parts[0].y_test) for p in parts)


def test_agent_data_digits_by_name() -> None:
    part = load_agent_data(DataRequest(dataset="digits", partition="shards:2"), 3, 7, ImageModel())
    assert part.x_train.shape[1:] == (8, 8, 1) and len(part.y_test) == 899
    assert len(np.unique(part.y_train)) <= 3
