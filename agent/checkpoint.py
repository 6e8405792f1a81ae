"""Checkpoints: the full training state on disk, written atomically (temp file + rename)."""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_NAME = "checkpoint.npz"


@dataclass(frozen=True)
class Checkpoint:
    round: int  # the next round to run
    epoch: int
    state: np.ndarray  # params + optimizer state, flat float32
    meta: dict[str, str | int | float]


def save(directory: Path, checkpoint: Checkpoint) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / _NAME
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(
                fh,
                state=checkpoint.state.astype(np.float32),
                round=np.int64(checkpoint.round),
                epoch=np.int64(checkpoint.epoch),
                crc=np.uint32(zlib.crc32(checkpoint.state.astype(np.float32).tobytes())),
                meta=np.frombuffer(json.dumps(checkpoint.meta).encode(), dtype=np.uint8),
            )
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load(directory: Path) -> Checkpoint | None:
    """The checkpoint in ``directory``, None if there is none or it is unreadable/corrupt."""
    path = directory / _NAME
    if not path.exists():
        return None
    try:
        with np.load(path) as z:
            state = z["state"].astype(np.float32)
            if int(z["crc"]) != zlib.crc32(state.tobytes()):
                return None
            meta = json.loads(bytes(z["meta"]).decode())
            return Checkpoint(int(z["round"]), int(z["epoch"]), state, meta)
    except (OSError, ValueError, KeyError, zlib.error):
        return None
