"""One agent's part of MNIST read from a ``.npz`` without ever holding all 60,000 images.

``np.load`` on a ``.npz`` reads each array whole: 47 MB of training pixels held at once, for an
agent that keeps a seventh of them (the peak resident memory of a small device counts it). Here
the training images stream through in blocks of rows: each block is hashed for the content
checksum and the part's rows are copied out, so the peak is the part, the test set and one block.
The rows come out in the part's order, so the arrays equal ``x_train[part]`` of a whole load.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]
Indices = npt.NDArray[np.intp]
BLOCK_ROWS = 2048  # rows of training pixels per read (1.6 MB of MNIST)
BLOCK_BYTES = 1 << 20  # bytes per read of the other arrays
KEYS = ("x_train", "y_train", "x_test", "y_test")  # the checksum's order


class NotStreamable(Exception):
    """This file cannot be streamed (compressed members aside, which stream fine: another dtype,
    Fortran order, an unknown header); the caller reads it whole, which explains any fault."""


def read_part(path: Path, rows: dict[str, int], pixels: int, pick: Callable[[U8], Indices],
              test_limit: int) -> tuple[dict[str, U8], str]:
    """(arrays, sha256 of the whole content): ``x_train``/``y_train`` of the rows ``pick`` chooses
    from the training labels (in its order), ``x_test``/``y_test`` cut to ``test_limit`` rows.
    ``rows``: the expected row count of every key; ``pixels``: values per image."""
    try:
        with zipfile.ZipFile(path) as archive:
            return _read(archive, rows, pixels, pick, test_limit)
    except (OSError, zipfile.BadZipFile, ValueError, KeyError, EOFError) as exc:
        raise NotStreamable(str(exc)) from exc


def _read(archive: zipfile.ZipFile, rows: dict[str, int], pixels: int,
          pick: Callable[[U8], Indices], test_limit: int) -> tuple[dict[str, U8], str]:
    def width(key: str) -> int:
        return pixels if key.startswith("x") else 1

    with archive.open("y_train.npy") as member:
        y_train = _read_rows(member, _header(member, rows["y_train"]), 1, rows["y_train"])
    part = pick(y_train)
    digest = hashlib.sha256()
    with archive.open("x_train.npy") as member:
        x_train = _pick_rows(member, _header(member, rows["x_train"], pixels), pixels, part, digest)
    digest.update(y_train.data)
    out = {"x_train": x_train, "y_train": y_train[part]}
    for key in ("x_test", "y_test"):
        with archive.open(f"{key}.npy") as member:
            whole = _read_rows(member, _header(member, rows[key], width(key)), width(key), rows[key])
        digest.update(whole.data)
        out[key] = whole[:test_limit].copy() if test_limit < len(whole) else whole
    return out, digest.hexdigest()


def _header(member: IO[bytes], rows: int, per_row: int = 1) -> int:
    """Checks the ``.npy`` header (uint8, C order, ``rows`` rows of ``per_row`` values): the
    number of bytes that follow it."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise NotStreamable(f".npy format {version}")
    if dtype != np.uint8 or fortran or not shape or shape[0] != rows or int(np.prod(shape)) != rows * per_row:
        raise NotStreamable(f"array {dtype} {shape} (fortran {fortran})")
    return rows * per_row


def _read_rows(member: IO[bytes], size: int, per_row: int, rows: int) -> U8:
    """The next ``size`` bytes as ``rows`` rows (one value each: a vector), a writable array,
    read a block at a time (a zip member's ``read(size)`` would make a second copy of it)."""
    out = np.empty(size, dtype=np.uint8)
    done = 0
    while done < size:
        blob = member.read(min(size - done, BLOCK_BYTES))
        if not blob:
            raise NotStreamable(f"truncated: {done} of {size} bytes")
        out[done:done + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        done += len(blob)
    return out if per_row == 1 else out.reshape(rows, per_row)


def _pick_rows(member: IO[bytes], size: int, per_row: int, part: Indices,
               digest: hashlib._Hash) -> U8:
    """Rows ``part`` (in that order) of the ``size`` bytes ahead, hashing every byte."""
    out = np.empty((len(part), per_row), dtype=np.uint8)
    order = np.argsort(part, kind="stable")
    wanted = part[order]
    total_rows = size // per_row
    for start in range(0, total_rows, BLOCK_ROWS):
        count = min(BLOCK_ROWS, total_rows - start)
        block = _read_rows(member, count * per_row, per_row, count)
        digest.update(block.data)
        lo, hi = np.searchsorted(wanted, (start, start + count))
        out[order[lo:hi]] = block[wanted[lo:hi] - start]
    return out
