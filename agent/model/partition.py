"""How a fleet splits one dataset among its agents: pure functions, deterministic in the seed.

- ``iid``: a seeded permutation cut into near-equal parts.
- ``all``: no split; every agent trains on all of its data (devices holding their own files).
- ``shards:K``: the samples sorted by label, cut into ``K x agents`` equal shards; each agent
  gets ``K`` of them at random (McMahan et al. 2017, "Communication-Efficient Learning of Deep
  Networks from Decentralized Data"): with K = 2 an agent sees about two classes.
- ``dirichlet:ALPHA``: for every class, proportions over the agents drawn from
  Dirichlet(ALPHA, ..., ALPHA), and the class's samples dealt out in those proportions (the
  split of Hsu et al. 2019, "Measuring the Effects of Non-Identical Data Distribution for
  Federated Visual Classification", as most federated-learning code implements it). Small
  ALPHA: each agent holds few classes; large ALPHA: close to IID.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Indices = npt.NDArray[np.intp]
PARTITIONS = ("iid", "shards:K", "dirichlet:ALPHA", "all")
# Redraws before a Dirichlet split that leaves an agent without samples is given up.
DIRICHLET_TRIES = 1000


class PartitionKind(enum.StrEnum):
    IID = "iid"
    ALL = "all"
    SHARDS = "shards"
    DIRICHLET = "dirichlet"


@dataclass(frozen=True)
class Partition:
    kind: PartitionKind
    shards: int = 0  # SHARDS: shards per agent
    alpha: float = 0.0  # DIRICHLET: concentration

    def __str__(self) -> str:
        if self.kind is PartitionKind.SHARDS:
            return f"shards:{self.shards}"
        if self.kind is PartitionKind.DIRICHLET:
            return f"dirichlet:{self.alpha:g}"
        return str(self.kind)


def parse_partition(spec: str) -> Partition:
    """``iid``, ``all``, ``shards:K`` (K >= 1) or ``dirichlet:ALPHA`` (ALPHA > 0); ValueError
    else."""
    kind, _, value = spec.strip().partition(":")
    if kind in (PartitionKind.IID, PartitionKind.ALL) and not value:
        return Partition(PartitionKind(kind))
    try:
        if kind == PartitionKind.SHARDS:
            shards = int(value)
            if shards >= 1:
                return Partition(PartitionKind.SHARDS, shards=shards)
        elif kind == PartitionKind.DIRICHLET:
            alpha = float(value)
            if alpha > 0 and np.isfinite(alpha):
                return Partition(PartitionKind.DIRICHLET, alpha=alpha)
    except ValueError:
        pass
    raise ValueError(f"unknown partition {spec!r}; use iid, shards:K (K >= 1), dirichlet:ALPHA (ALPHA > 0) "
                     "or all")


def split(labels: npt.NDArray[np.integer[Any]], count: int, spec: str | Partition, seed: int) -> list[Indices]:
    """The sample indices of every agent 0..count-1: each sample in exactly one part (``all``:
    every sample in every part)."""
    if count < 1:
        raise ValueError(f"need at least one agent, got {count}")
    partition = parse_partition(spec) if isinstance(spec, str) else spec
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    if partition.kind is PartitionKind.ALL:
        return [np.arange(len(labels)) for _ in range(count)]
    if partition.kind is PartitionKind.IID:
        return list(np.array_split(order, count))
    if partition.kind is PartitionKind.SHARDS:
        return _shards(labels, order, count, partition.shards, rng)
    return _dirichlet(labels, count, partition.alpha, rng)


def part(labels: npt.NDArray[np.integer[Any]], index: int, count: int, spec: str | Partition, seed: int) -> Indices:
    """Agent ``index``'s sample indices out of ``count``."""
    if not 0 <= index < count:
        raise ValueError(f"agent index must be in [0, {count}), got {index} of {count}")
    return split(labels, count, spec, seed)[index]


def _shards(labels: npt.NDArray[Any], order: Indices, count: int, per_agent: int,
            rng: np.random.Generator) -> list[Indices]:
    by_label = order[np.argsort(labels[order], kind="stable")]
    total = count * per_agent
    if total > len(labels):
        raise ValueError(f"shards:{per_agent} over {count} agents needs {total} shards but there are "
                         f"only {len(labels)} samples")
    pieces = np.array_split(by_label, total)
    dealt = rng.permutation(total)
    return [np.concatenate([pieces[s] for s in dealt[i * per_agent:(i + 1) * per_agent]])
            for i in range(count)]


def _dirichlet(labels: npt.NDArray[Any], count: int, alpha: float, rng: np.random.Generator) -> list[Indices]:
    classes = np.unique(labels)
    for _ in range(DIRICHLET_TRIES):
        parts: list[list[Indices]] = [[] for _ in range(count)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(count, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(np.intp)
            for agent, piece in enumerate(np.split(members, cuts)):
                parts[agent].append(piece)
        result = [np.concatenate(p) if p else np.empty(0, dtype=np.intp) for p in parts]
        if min(len(r) for r in result) > 0:
            return result
    raise ValueError(f"dirichlet:{alpha:g} leaves an agent without samples ({len(labels)} samples over "
                     f"{count} agents): raise ALPHA or use fewer agents")


def label_histogram(labels: npt.NDArray[np.integer[Any]], num_classes: int) -> list[int]:
    """How many samples of each class 0..num_classes-1 (a report's per-agent line)."""
    return [int(n) for n in np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)[:num_classes]]
