"""Data files are weighed before they are read: a file too large for the device's memory (or
the configured cap) is refused in one line, its samples never loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.model.data_budget import (
    LOAD_PEAK_FACTOR,
    DataBudget,
    DataTooLarge,
    available_memory,
    check_data_budget,
    parsed_bytes,
)
from agent.model.user_data import load_user_data

FEATURES = 20


def _csv(path: Path, rows: int, bad_tail: bool = False) -> Path:
    rng = np.random.default_rng(0)
    lines = ["label," + ",".join(f"f{i}" for i in range(FEATURES))]
    for r in range(rows):
        values = ",".join(str(v) for v in rng.integers(0, 256, FEATURES))
        lines.append(f"{r % 10},{values}")
    if bad_tail:  # a loader that read this far would say so instead
        lines.append("3," + ",".join(["oops"] * FEATURES))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_csv_estimate_is_close_to_what_its_samples_take(tmp_path: Path) -> None:
    path = _csv(tmp_path / "d.csv", 20_000)
    data = load_user_data(path, (FEATURES,))
    actual = data.x_train.nbytes + data.y_train.nbytes
    assert abs(parsed_bytes(path, (FEATURES,)) - actual) < 0.05 * actual


def test_a_compressed_npz_is_weighed_at_its_full_size(tmp_path: Path) -> None:
    path = tmp_path / "z.npz"
    np.savez_compressed(path, x=np.zeros((20_000, 500), dtype=np.uint8), y=np.zeros(20_000, dtype=np.int64))
    assert path.stat().st_size < 200_000  # zeros compress to almost nothing...
    assert parsed_bytes(path, (500,)) >= 20_000 * 500 * 4  # ...and inflate to float32


def test_data_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = _csv(tmp_path / "big.csv", 5_000, bad_tail=True)
    needed = parsed_bytes(path, (FEATURES,)) * LOAD_PEAK_FACTOR
    with pytest.raises(DataTooLarge, match="more than the configured data_max_mb") as refused:
        load_user_data(path, (FEATURES,), budget=DataBudget(cap_bytes=needed // 2))
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    with pytest.raises(DataTooLarge, match="more than the memory available"):
        check_data_budget(path, (FEATURES,), DataBudget(available_bytes=needed // 2))


def test_data_within_the_budget_loads(tmp_path: Path) -> None:
    path = _csv(tmp_path / "ok.csv", 1_000)
    needed = parsed_bytes(path, (FEATURES,)) * LOAD_PEAK_FACTOR
    data = load_user_data(path, (FEATURES,), budget=DataBudget(needed * 2, needed * 2))
    assert data.x_train.shape == (1_000, FEATURES)
    assert data.x_train[0].tolist() == [float(v) for v in path.read_text().splitlines()[1].split(",")[1:]]


def test_the_smaller_of_cap_and_available_memory_binds(tmp_path: Path) -> None:
    assert DataBudget(100, 50).limit() == 50
    assert DataBudget(100, 0).limit() == 100  # memory unknown: the cap alone
    assert DataBudget(0, 0).limit() == 0  # nothing known: no limit
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  4000000 kB\nMemAvailable:  1500000 kB\n")
    assert available_memory(str(meminfo)) == 1_500_000 * 1024
    assert DataBudget.of_device(1.0, str(meminfo)) == DataBudget(2**20, 1_500_000 * 1024)
