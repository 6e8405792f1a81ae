"""Partitions: pure, deterministic, every sample in exactly one agent's part."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.model.partition import (
    Partition,
    PartitionKind,
    label_histogram,
    parse_partition,
    part,
    split,
)


def labels_of(n: int, classes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


@given(n=st.integers(40, 400), classes=st.integers(2, 10), count=st.integers(1, 8),
       seed=st.integers(0, 2**16), spec=st.sampled_from(["iid", "shards:1", "shards:2", "shards:3",
                                                          "dirichlet:0.1", "dirichlet:1", "dirichlet:100"]))
def test_every_sample_in_exactly_one_part(n: int, classes: int, count: int, seed: int, spec: str) -> None:
    labels = labels_of(n, classes, seed)
    parts = split(labels, count, spec, seed)
    assert len(parts) == count
    joined = np.sort(np.concatenate(parts))
    assert np.array_equal(joined, np.arange(n))
    assert all(len(p) > 0 for p in parts)
    again = split(labels, count, spec, seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_part_is_split_of_one_agent_and_the_seed_matters() -> None:
    labels = labels_of(500, 10, 1)
    assert np.array_equal(part(labels, 2, 5, "dirichlet:0.5", 3), split(labels, 5, "dirichlet:0.5", 3)[2])
    assert not np.array_equal(part(labels, 2, 5, "iid", 3), part(labels, 2, 5, "iid", 4))


def test_all_gives_every_agent_everything() -> None:
    labels = labels_of(50, 3, 0)
    assert all(np.array_equal(p, np.arange(50)) for p in split(labels, 4, "all", 0))


def skew(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> float:
    """Mean total-variation distance between each agent's label mix and the whole's."""
    whole = np.bincount(labels, minlength=classes) / len(labels)
    mixes = [np.bincount(labels[p], minlength=classes) / max(len(p), 1) for p in parts]
    return float(np.mean([0.5 * np.abs(m - whole).sum() for m in mixes]))


def test_dirichlet_skew_grows_as_alpha_falls() -> None:
    labels = labels_of(6000, 10, 0)
    skews = [np.mean([skew(labels, split(labels, 7, f"dirichlet:{a}", s), 10) for s in range(5)])
             for a in (100.0, 1.0, 0.3, 0.05)]
    assert skews == sorted(skews), skews
    assert skews[0] < 0.1 and skews[-1] > 0.6
    assert skew(labels, split(labels, 7, "iid", 0), 10) < 0.05


def test_shards_give_few_classes_per_agent() -> None:
    labels = np.repeat(np.arange(10), 100)
    for agent_part in split(labels, 10, "shards:2", 0):
        assert len(np.unique(labels[agent_part])) <= 3
        assert len(agent_part) == 100


def test_parse_partition() -> None:
    assert parse_partition("iid") == Partition(PartitionKind.IID)
    assert parse_partition("shards:3") == Partition(PartitionKind.SHARDS, shards=3)
    assert parse_partition("dirichlet:0.5") == Partition(PartitionKind.DIRICHLET, alpha=0.5)
    assert str(parse_partition("dirichlet:0.5")) == "dirichlet:0.5"
    for bad in ("", "iid:2", "shards", "shards:0", "shards:x", "dirichlet:0", "dirichlet:-1",
                "dirichlet:nan", "random"):
        with pytest.raises(ValueError, match="unknown partition"):
            parse_partition(bad)


def test_impossible_splits_say_why() -> None:
    with pytest.raises(ValueError, match="needs 20 shards but there are only 10 samples"):
        split(np.arange(10) % 2, 10, "shards:2", 0)
    with pytest.raises(ValueError, match="leaves an agent without samples"):
        split(np.zeros(3, dtype=np.int64), 8, "dirichlet:0.01", 0)


def test_label_histogram() -> None:
    assert label_histogram(np.array([0, 2, 2, 1, 2]), 4) == [1, 1, 3, 0]
    assert label_histogram(np.array([], dtype=np.int64), 2) == [0, 0]
