"""Checkpoints: the full training state on disk, written atomically (temp file + rename).

``load`` never trusts the file: a checkpoint that cannot be read (empty, truncated, bits
flipped: the zip's CRC and our own CRC of the state catch those) or that is implausible (a
round or epoch no run reaches, non-finite values, a state of the wrong size, another job's or
node's file) is set aside, renamed ``checkpoint.npz.corrupt-<UTC time>``, with one warning
line, and ``load`` returns None: the agent starts as if it had no checkpoint and, when a fleet
is running, pulls the fleet's state through the join path.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import zipfile
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

try:  # ISA-L's CRC-32 is zlib's function (same value), ~4x faster on the 4.9 MB state
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - depends on the optional extra "fast"
    from zlib import crc32 as _crc32

_NAME = "checkpoint.npz"
_FIELDS = frozenset({"state", "round", "epoch", "crc", "meta"})
MAX_ROUND = 10**9  # a billion rounds: about 30 years at one round per second
MAX_EPOCH = 2**53  # view epochs travel as JSON numbers: beyond this they are not exact

log = logging.getLogger("edgegrove.agent.checkpoint")


@dataclass(frozen=True)
class Checkpoint:
    round: int  # the next round to run
    epoch: int
    state: np.ndarray  # params + optimizer state, flat float32
    meta: dict[str, str | int | float]


@dataclass(frozen=True)
class Plausible:
    """What a checkpoint this agent may resume from looks like (None: not checked)."""

    state_size: int | None = None  # values of params + optimizer state (backend.state_size)
    max_round: int = MAX_ROUND  # the run's last round when it has a budget
    job: str | None = None  # meta["job"] must match
    node: int | None = None  # meta["node"] must match


class Unreadable(ValueError):
    """The file is not a checkpoint we wrote (damaged or foreign); the message says how."""


def save(directory: Path, checkpoint: Checkpoint) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / _NAME
    state = np.ascontiguousarray(checkpoint.state, dtype=np.float32)  # no copy when it is one
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_npz(fh, {
                "state": state,
                "round": np.int64(checkpoint.round),
                "epoch": np.int64(checkpoint.epoch),
                "crc": np.uint32(_crc32(state.data.cast("B"))),
                "meta": np.frombuffer(json.dumps(checkpoint.meta).encode(), dtype=np.uint8),
            })
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _write_npz(fh: BinaryIO, fields: dict[str, Any]) -> None:
    """What ``np.savez(fh, **fields)`` writes (an uncompressed zip of ``.npy`` members), but
    a flat native-order array is written from its own memory: ``savez`` copies the 4.9 MB
    state into a bytes object first."""
    with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in fields.items():
            array = np.asanyarray(value)
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                if array.ndim == 1 and array.flags.c_contiguous and array.dtype.isnative \
                        and not array.dtype.hasobject:
                    np.lib.format.write_array_header_1_0(
                        member, np.lib.format.header_data_from_array_1_0(array))
                    member.write(array.data.cast("B"))
                else:
                    np.lib.format.write_array(member, array, allow_pickle=False)


class BackgroundWriter:
    """Writes checkpoints on one thread, the newest first. ``save`` ends with an fsync: a few
    MB on a Pi's SD card take longer than a round, and the whole fleet would wait for this
    agent at every checkpoint (on this 2-core host the 7 agents' writes made every 20th
    round ~0.1 s longer). A checkpoint submitted while one is being written replaces any
    that is still waiting: only the newest is worth the disk time. ``close`` waits for the
    last one (the final checkpoint of a run must be on disk when the agent exits)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.written = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._waiting: Checkpoint | None = None
        self._thread: threading.Thread | None = None

    def submit(self, checkpoint: Checkpoint) -> None:
        with self._lock:
            self._waiting = checkpoint
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="checkpoint-writer", daemon=True)
                self._thread.start()

    def close(self) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _drain(self) -> None:
        while True:
            with self._lock:
                checkpoint, self._waiting = self._waiting, None
                if checkpoint is None:
                    self._thread = None
                    return
            try:
                save(self.directory, checkpoint)
                self.written += 1
            except OSError as exc:
                # A full or read-only disk must not stop training: the fleet holds the state.
                self.failed += 1
                log.error("could not write the checkpoint of round %d to %s: %s",
                          checkpoint.round, self.directory, exc)


def age(directory: Path, wall_now: float) -> float:
    """Seconds since the checkpoint in ``directory`` was written (0 when there is none, or
    when the wall clock says it is from the future: a device whose clock was set back)."""
    try:
        written = (directory / _NAME).stat().st_mtime
    except OSError:
        return 0.0
    return max(0.0, wall_now - written)


def load(directory: Path, *, expect: Plausible | None = None) -> Checkpoint | None:
    """The checkpoint in ``directory``; None if there is none, or if it is unreadable or
    implausible (then it is set aside with a warning, see the module docstring)."""
    path = directory / _NAME
    if not path.exists():
        return None
    try:
        saved = read(path)
    except Unreadable as exc:
        set_aside(path, f"unreadable: {exc}")
        return None
    trouble = problem(saved, expect or Plausible())
    if trouble is not None:
        set_aside(path, f"implausible: {trouble}")
        return None
    return saved


def read(path: Path) -> Checkpoint:
    """The checkpoint in ``path`` exactly as written; ``Unreadable`` when it is not that."""
    try:
        _check_archive(path)
        with np.load(path, allow_pickle=False) as z:
            missing = _FIELDS - set(z.files)
            if missing:
                raise Unreadable(f"fields {sorted(missing)} are missing")
            state = z["state"]
            if state.dtype != np.float32 or zlib.crc32(state.tobytes()) != int(z["crc"]):
                raise Unreadable("the state does not match its CRC")
            meta = json.loads(bytes(z["meta"]).decode())
            if not isinstance(meta, dict):
                raise Unreadable("its meta is not a JSON object")
            return Checkpoint(int(z["round"]), int(z["epoch"]), state, meta)
    except Unreadable:
        raise
    except Exception as exc:  # a damaged file raises anything: BadZipFile, EOFError, ...
        raise Unreadable(f"{type(exc).__name__}: {exc}") from None


def _check_archive(path: Path) -> None:
    """The zip's own CRC-32 of every member: catches flipped bits before numpy parses them."""
    with zipfile.ZipFile(path) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise Unreadable(f"member {bad} fails its CRC (flipped bits)")


def problem(saved: Checkpoint, expect: Plausible) -> str | None:
    """Why ``saved`` cannot be the state of this agent's run, or None if it can."""
    if not 0 <= saved.round <= expect.max_round:
        return f"round {saved.round} is outside 0..{expect.max_round}"
    if not 0 <= saved.epoch <= MAX_EPOCH:
        return f"view epoch {saved.epoch} is outside 0..2^53"
    return _state_problem(saved.state, expect.state_size) or _meta_problem(saved.meta, expect)


def _state_problem(state: np.ndarray, size: int | None) -> str | None:
    if state.ndim != 1 or state.size == 0:
        return f"the state has shape {state.shape}, not a non-empty flat vector"
    if size is not None and state.size != size:
        return f"the state has {state.size} values, this model and optimizer need {size}"
    bad = int(np.count_nonzero(~np.isfinite(state)))
    if bad:
        return f"{bad} of {state.size} state values are NaN or infinite"
    return None


def _meta_problem(meta: dict[str, str | int | float], expect: Plausible) -> str | None:
    if expect.job is not None and meta.get("job") != expect.job:
        return f"it belongs to job {meta.get('job')!r}, not {expect.job!r}"
    if expect.node is not None and meta.get("node") != expect.node:
        return f"it belongs to node {meta.get('node')!r}, not {expect.node}"
    return None


def set_aside(path: Path, reason: str) -> Path | None:
    """Rename ``path`` to ``<name>.corrupt-<UTC time>`` (kept for a post-mortem) and warn once."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        path.rename(target)
    except OSError as exc:
        log.warning("checkpoint %s is %s; could not set it aside (%s); starting without it",
                    path, _one_line(reason), exc)
        return None
    log.warning("checkpoint %s is %s; set aside as %s; starting without it (a running fleet's "
                "state is pulled on joining)", path, _one_line(reason), target.name)
    return target


def _one_line(text: str) -> str:
    return " ".join(text.split())
