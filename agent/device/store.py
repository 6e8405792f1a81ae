"""The device's state directory: the job in progress, the jobs ended, model files, checkpoints.

    <state_dir>/device-state.json         {"envelope": ..., "seq": n, "finished": [[job, t], ...]}
    <state_dir>/blobs/<sha256>/<filename>  model files, hash-checked before they are kept
    <state_dir>/jobs/<job>/checkpoints/    the agent runtime's checkpoints (resume as the same node)

Written atomically (temp file + rename): a device killed at any moment restarts from a whole
file, and resumes the job it was running.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from agent.device.actions import Persist
from agent.device.events import Booted
from agent.jobs.document import BlobRef

log = logging.getLogger("edgegrove.device")
STATE_FILE = "device-state.json"


class StateStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def booted(self) -> Booted:
        """What the last life left, its job's signature not yet checked (the daemon does)."""
        try:
            saved = json.loads((self.root / STATE_FILE).read_text())
            envelope = saved.get("envelope")
            finished = tuple((str(job), float(t)) for job, t in saved.get("finished", []))
            return Booted(base64.b64decode(envelope) if envelope else None, None, int(saved.get("seq", 0)), finished)
        except FileNotFoundError:
            return Booted(None)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("the state file %s cannot be read (%s): starting idle", self.root / STATE_FILE, exc)
            return Booted(None)

    def persist(self, action: Persist) -> None:
        envelope = base64.b64encode(action.envelope).decode() if action.envelope else None
        _atomic_write(self.root / STATE_FILE, json.dumps(
            {"envelope": envelope, "seq": action.seq, "finished": [list(f) for f in action.finished]}))
        for job, _ in action.finished:  # an ended job's checkpoints are of no further use
            shutil.rmtree(self.checkpoints(job), ignore_errors=True)

    def checkpoints(self, job: str) -> Path:
        return self.root / "jobs" / job / "checkpoints"

    def blob_path(self, blob: BlobRef) -> Path:
        return self.root / "blobs" / blob.sha256 / blob.filename

    def has_blob(self, blob: BlobRef) -> bool:
        path = self.blob_path(blob)
        try:
            return path.stat().st_size == blob.size and _sha256(path) == blob.sha256
        except OSError:
            return False

    def store_blob(self, blob: BlobRef, data: bytes) -> Path:
        path = self.blob_path(blob)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, data)
        return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _atomic_write(path: Path, data: str | bytes) -> None:
    temp = path.with_name(path.name + ".tmp")
    raw = data.encode() if isinstance(data, str) else data
    with temp.open("wb") as f:
        f.write(raw)
        f.flush()
        with contextlib.suppress(OSError):
            os.fsync(f.fileno())
    temp.replace(path)
