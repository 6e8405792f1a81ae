"""Count a data source's samples and labels, in a process of its own.

    python -m agent.device.datasummary < sources.json > summaries.json

The device runs this once per source (the answer is cached in its state directory): reading a
whole dataset (MNIST from its package peaks at hundreds of MB; digits imports scikit-learn)
must not stay in the resident memory of a daemon that idles for weeks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model.data import DataError


def labels_of(fmt: str, path: Path | None, label_column: str) -> npt.NDArray[np.int64]:
    """The training labels of one source (its held-out test part is not counted)."""
    if fmt == "mnist":
        from agent.model.data import load_mnist

        return np.asarray(load_mnist(str(path) if path else None).y_train, dtype=np.int64)
    if fmt == "digits":
        from agent.model.datasets import load_digits

        return load_digits().y_train
    assert path is not None
    if fmt in ("npz", "csv"):  # too large for this device: said in its record, never read
        from agent.model.data_budget import DataBudget, check_data_budget

        check_data_budget(path, (1,), DataBudget.of_device(), label_column)
    if fmt == "npz":
        from agent.model.user_data import load_npz

        return load_npz(path).y_train
    if fmt == "csv":
        from agent.model.user_data import load_csv

        return load_csv(path, label_column).y_train
    from agent.model.user_data import class_folders

    counts = [(label, sum(1 for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")))
              for label, folder in class_folders(path)]
    return np.repeat(np.array([c[0] for c in counts], dtype=np.int64), [c[1] for c in counts])


def summarize(source: dict[str, Any]) -> dict[str, Any]:
    path = Path(source["path"]) if source.get("path") else None
    try:
        labels = labels_of(source["format"], path, source.get("label_column", "label"))
    except (DataError, OSError, ValueError) as exc:
        return {"format": source["format"], "samples": 0, "labels": [], "error": str(exc)[:300]}
    histogram = np.bincount(labels[labels >= 0]).tolist() if len(labels) else []
    return {"format": source["format"], "samples": len(labels), "labels": histogram}


def main() -> int:
    sources = json.load(sys.stdin)
    json.dump({name: summarize(source) for name, source in sources.items()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
