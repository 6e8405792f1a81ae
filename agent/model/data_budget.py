"""A device's own data file is measured before it is read: what its samples take once parsed,
against the memory the device has (or a configured cap), so a file too large is refused in one
line instead of taking the device down while it loads (a 2 GB CSV peaked at 4.27 GB).

The estimate reads only a file's size and a little of its head (a CSV's header and first lines,
an ``.npz``'s array headers, an image folder's file count), never its samples.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.model.data import DataError

MEMINFO = "/proc/meminfo"
CSV_SAMPLE_BYTES = 1 << 16  # the head of a CSV whose lines give the mean line length
FEATURE_BYTES = 4  # float32 per feature value once parsed
LABEL_BYTES = 8  # int64 per label
# Resident bytes while loading, per byte of parsed samples: the loader's chunks and their
# concatenation, the held-out split's copies and this agent's part.
LOAD_PEAK_FACTOR = 3


class DataTooLarge(DataError):
    """The data would not fit in the memory this device may give it."""


@dataclass(frozen=True)
class DataBudget:
    """The memory loading the data may take: ``cap_bytes`` (configured; 0: none) and the
    memory available now (0: unknown); the smaller one that is set binds."""

    cap_bytes: int = 0
    available_bytes: int = 0

    @classmethod
    def of_device(cls, cap_mb: float = 0.0, meminfo: str = MEMINFO) -> DataBudget:
        return cls(int(cap_mb * 2**20), available_memory(meminfo))

    def limit(self) -> int:
        """Bytes loading may take (0: no limit known)."""
        limits = [b for b in (self.cap_bytes, self.available_bytes) if b > 0]
        return min(limits) if limits else 0


def available_memory(meminfo: str = MEMINFO) -> int:
    """MemAvailable of /proc/meminfo in bytes (0: unknown)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "MemAvailable":
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def check_data_budget(path: Path, input_shape: tuple[int, ...], budget: DataBudget,
                      label_column: str = "label") -> None:
    """DataTooLarge (one line) when the data at ``path`` would take more than the budget."""
    limit = budget.limit()
    if limit <= 0:
        return
    needed = parsed_bytes(path, input_shape, label_column) * LOAD_PEAK_FACTOR
    if needed > limit:
        which = "the configured data_max_mb" if limit == budget.cap_bytes else "the memory available"
        raise DataTooLarge(f"{path}: loading its samples would take about {_mb(needed)} "
                           f"({_mb(path_bytes(path))} on disk), more than {which} ({_mb(limit)}); "
                           "use a smaller file or split it")


def parsed_bytes(path: Path, input_shape: tuple[int, ...], label_column: str = "label") -> int:
    """Bytes the samples at ``path`` take once parsed (float32 features, int64 labels)."""
    if path.is_dir():
        images = sum(1 for f in path.rglob("*") if f.is_file() and not f.name.startswith("."))
        return images * (int(np.prod(input_shape)) * FEATURE_BYTES + LABEL_BYTES)
    if path.suffix == ".npz":
        return _npz_parsed_bytes(path)
    if path.suffix == ".csv":
        return _csv_parsed_bytes(path)
    return 0  # an unknown format: the loader says so


def path_bytes(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _csv_parsed_bytes(path: Path) -> int:
    """Rows estimated from the mean length of the head's lines, columns from its header."""
    size = path_bytes(path)
    try:
        with path.open("rb") as f:
            head = f.read(CSV_SAMPLE_BYTES)
    except OSError:
        return 0  # unreadable: the loader says why
    lines = head.splitlines()
    if len(lines) < 2:
        return 0
    columns = lines[0].count(b",") + 1
    body = lines[1:-1] if len(head) == CSV_SAMPLE_BYTES and len(lines) > 2 else lines[1:]
    mean_line = max(1.0, sum(len(line) + 1 for line in body) / len(body))
    rows = int((size - len(lines[0]) - 1) / mean_line) + 1
    return rows * ((columns - 1) * FEATURE_BYTES + LABEL_BYTES)


def _npz_parsed_bytes(path: Path) -> int:
    """Elements of every array, from the headers inside the zip (a compressed file's arrays
    are counted at their full size, so a small file that inflates is seen)."""
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if not name.endswith(".npy"):
                    continue
                with archive.open(name) as member:
                    major, _ = np.lib.format.read_magic(member)
                    read_header = (np.lib.format.read_array_header_1_0 if major == 1
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, _ = read_header(member)
                total += int(np.prod(shape, dtype=np.int64)) * FEATURE_BYTES
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):
        return 0  # not a readable .npz: the loader says why
    return total


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"
