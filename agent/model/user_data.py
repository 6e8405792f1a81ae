"""A device's own data: ``.npz``, CSV with a label column, or a folder of images.

- ``.npz``: arrays ``x`` and ``y`` (also ``x_train``/``y_train``), optionally ``x_test`` and
  ``y_test``. ``x`` is any numeric array with one sample per row; integer pixels 0..255
  (uint8) are scaled to [0, 1).
- CSV: a header row; the label column (``--label-column``, default ``label``) holds integer
  classes 0..num_classes-1, every other column a number (one feature each).
- a folder with one subfolder per class, holding images (Pillow reads them: PNG, JPEG, ...).
  Subfolders named 0, 1, 2, ... are those classes; otherwise classes are the subfolders'
  names in sorted order, so every device needs the same set of subfolders (an empty one for a
  class it has no samples of). Images are converted to the model's channels (1: grey, 3: RGB)
  and resized to its input size.

Nothing here knows MNIST; ``agent.model.datasets`` routes MNIST files to its own loader.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model.data import DataError, Dataset
from agent.model.data_budget import DataBudget, check_data_budget

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
EMPTY_X = np.zeros((0, 1), dtype=np.float32)


def load_user_data(path: Path, input_shape: tuple[int, ...], label_column: str = "label",
                   budget: DataBudget | None = None) -> Dataset:
    """The samples at ``path`` (test split empty when the data has none); DataTooLarge before
    anything is read when loading them would take more than ``budget``."""
    if budget is not None:
        check_data_budget(path, input_shape, budget, label_column)
    if path.is_dir():
        return load_image_folder(path, input_shape)
    if path.suffix == ".npz":
        return load_npz(path)
    if path.suffix == ".csv":
        return load_csv(path, label_column)
    raise DataError(f"{path}: unknown data format (use a .npz with x and y, a .csv with a "
                    f"{label_column!r} column, or a folder with one subfolder of images per class)")


def load_npz(path: Path) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as exc:  # zipfile/np.load raise many kinds on a damaged file
        raise DataError(f"{path}: cannot read .npz ({type(exc).__name__}: {exc})") from exc
    x_key = "x" if "x" in arrays else "x_train" if "x_train" in arrays else None
    y_key = "y" if "y" in arrays else "y_train" if "y_train" in arrays else None
    if x_key is None or y_key is None:
        raise DataError(f"{path}: needs arrays x and y (and optionally x_test, y_test); it holds "
                        f"{', '.join(sorted(arrays)) or 'none'}")
    x, y = _features(arrays[x_key], f"{path}:{x_key}"), _labels(arrays[y_key], f"{path}:{y_key}")
    _same_length(x, y, f"{path}: {x_key} and {y_key}")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise DataError(f"{path}: has only one of x_test and y_test; give both or neither")
    if "x_test" in arrays:
        x_test = _features(arrays["x_test"], f"{path}:x_test")
        y_test = _labels(arrays["y_test"], f"{path}:y_test")
        _same_length(x_test, y_test, f"{path}: x_test and y_test")
        if x_test.shape[1:] != x.shape[1:]:
            raise DataError(f"{path}: x_test's samples have shape {x_test.shape[1:]}, x's {x.shape[1:]}")
    else:
        x_test, y_test = EMPTY_X.reshape(0, *x.shape[1:]), np.zeros(0, dtype=np.int64)
    return Dataset(x, y, x_test, y_test, source=str(path))


def _features(array: npt.NDArray[Any], name: str) -> F32:
    if array.ndim < 2 or len(array) == 0:
        raise DataError(f"{name}: needs one sample per row (shape (n, ...) with n > 0), got {array.shape}")
    if array.dtype == np.uint8:
        return (array.astype(np.float32) * np.float32(1.0 / 255.0)).astype(np.float32)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise DataError(f"{name}: needs numbers, got dtype {array.dtype}")
    x = array.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise DataError(f"{name}: holds NaN or inf")
    return x


def _labels(array: npt.NDArray[Any], name: str) -> I64:
    flat = array.reshape(-1) if array.ndim == 2 and array.shape[1] == 1 else array
    if flat.ndim != 1:
        raise DataError(f"{name}: labels must be one integer per sample, got shape {array.shape}")
    if np.issubdtype(flat.dtype, np.floating) and np.all(np.isfinite(flat)) and np.all(flat == np.round(flat)):
        flat = flat.astype(np.int64)
    if not np.issubdtype(flat.dtype, np.integer):
        raise DataError(f"{name}: labels must be integers 0..num_classes-1, got dtype {array.dtype}")
    return flat.astype(np.int64)


def _same_length(x: npt.NDArray[Any], y: npt.NDArray[Any], what: str) -> None:
    if len(x) != len(y):
        raise DataError(f"{what} differ in length ({len(x)} samples, {len(y)} labels)")


def load_csv(path: Path, label_column: str = "label") -> Dataset:
    """Read row by row into float32 blocks: the text's rows are never all held at once."""
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            if label_column not in header:
                if not header:
                    raise DataError(f"{path}: needs a header row and at least one sample")
                raise DataError(f"{path}: no label column {label_column!r} (columns: {', '.join(header)}); "
                                "name it with --label-column")
            x, y = _csv_rows(reader, header, header.index(label_column), path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read CSV ({type(exc).__name__}: {exc})") from exc
    if len(y) == 0:
        raise DataError(f"{path}: needs a header row and at least one sample")
    if len(header) < 2:
        raise DataError(f"{path}: has no feature column besides {label_column!r}")
    return Dataset(x, y, EMPTY_X.reshape(0, x.shape[1]), np.zeros(0, dtype=np.int64), source=str(path))


CSV_BLOCK_ROWS = 4096


def _csv_rows(reader: Any, header: list[str], at: int, path: Path) -> tuple[F32, I64]:
    blocks: list[F32] = []
    features: list[list[float]] = []
    labels: list[int] = []
    for line, row in enumerate(reader, start=2):
        if not any(cell.strip() for cell in row):
            continue  # a blank line (often the last)
        if len(row) != len(header):
            raise DataError(f"{path}:{line}: {len(row)} values, the header has {len(header)}")
        labels.append(_csv_label(row[at], path, line, header[at]))
        features.append([_csv_number(cell, path, line, header[i]) for i, cell in enumerate(row) if i != at])
        if len(features) == CSV_BLOCK_ROWS:
            blocks.append(np.asarray(features, dtype=np.float32))
            features = []
    blocks.append(np.asarray(features, dtype=np.float32).reshape(len(features), len(header) - 1))
    return np.concatenate(blocks), np.asarray(labels, dtype=np.int64)


def _csv_label(cell: str, path: Path, line: int, column: str) -> int:
    try:
        value = float(cell)
    except ValueError:
        raise DataError(f"{path}:{line}: label {cell.strip()!r} in column {column!r} is not an integer "
                        "class (use 0..num_classes-1)") from None
    if not value.is_integer():
        raise DataError(f"{path}:{line}: label {cell.strip()!r} is not an integer class")
    return int(value)


def _csv_number(cell: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise DataError(f"{path}:{line}: column {column!r} holds {cell.strip()!r}, not a number "
                        "(features must be numeric)") from None
    if not np.isfinite(value):
        raise DataError(f"{path}:{line}: column {column!r} holds {cell.strip()!r}")
    return value


def class_folders(root: Path) -> list[tuple[int, Path]]:
    """(label, subfolder) for every class subfolder of ``root``."""
    folders = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.name)
    if not folders:
        raise DataError(f"{root}: an image folder needs one subfolder per class (e.g. {root}/0, {root}/1)")
    names = [p.name for p in folders]
    if all(n.isdigit() for n in names):
        return sorted(((int(p.name), p) for p in folders), key=lambda pair: pair[0])
    return list(enumerate(folders))


def load_image_folder(root: Path, input_shape: tuple[int, ...]) -> Dataset:
    """Every image under ``root/<class>/``, as float32 in [0, 1] of ``input_shape``."""
    image_module = _pillow()
    height, width, mode = _image_geometry(input_shape, root)
    samples: list[F32] = []
    labels: list[int] = []
    for label, folder in class_folders(root):
        for file in sorted(folder.iterdir()):
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with image_module.open(file) as image:
                    pixels = np.asarray(image.convert(mode).resize((width, height)), dtype=np.float32)
            except Exception as exc:  # Pillow raises many kinds on a broken file
                raise DataError(f"{file}: cannot read image ({type(exc).__name__}: {exc})") from exc
            samples.append(pixels / np.float32(255.0))
            labels.append(label)
    if not samples:
        raise DataError(f"{root}: no images ({', '.join(IMAGE_SUFFIXES)}) in its class subfolders")
    x = np.stack(samples).reshape(len(samples), *input_shape).astype(np.float32)
    return Dataset(x, np.asarray(labels, dtype=np.int64), EMPTY_X.reshape(0, *input_shape),
                   np.zeros(0, dtype=np.int64), source=str(root))


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise DataError("reading a folder of images needs Pillow: pip install pillow "
                        "(or pip install 'edgegrove[examples]')") from None
    return Image


def _image_geometry(input_shape: Sequence[int], root: Path) -> tuple[int, int, str]:
    """(height, width, Pillow mode) of the model's input: (H, W), (H, W, 1|3) or (n,) square."""
    shape = tuple(input_shape)
    if len(shape) == 3 and shape[2] in (1, 3):
        return shape[0], shape[1], "L" if shape[2] == 1 else "RGB"
    if len(shape) == 2:
        return shape[0], shape[1], "L"
    if len(shape) == 1 and int(np.sqrt(shape[0])) ** 2 == shape[0]:
        side = int(np.sqrt(shape[0]))
        return side, side, "L"
    raise DataError(f"{root}: images need a model input of (height, width[, 1 or 3]) or a square "
                    f"number of values, not {shape}")
