"""Content-addressed chunks: the model file going out, the trained parameters coming back."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np

from agent.jobs.document import DEFAULT_CHUNK_BYTES, BlobRef, ResultManifest
from agent.model.contract import F32


class ResultError(ValueError):
    """A result that cannot be taken: missing chunks, a wrong hash or size (one line)."""


def cut(data: bytes, chunk_size: int = DEFAULT_CHUNK_BYTES) -> list[bytes]:
    return [data[i:i + chunk_size] for i in range(0, len(data), chunk_size)]


def blob_ref(path: Path, factory: str = "factory", chunk_size: int = DEFAULT_CHUNK_BYTES) -> tuple[BlobRef, bytes]:
    """The reference a job document carries for the model file at ``path``, and its bytes."""
    data = path.read_bytes()
    ref = BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data), chunk_size=chunk_size,
                  chunks=max(1, math.ceil(len(data) / chunk_size)), filename=path.name, factory=factory)
    return ref, data


def assemble(manifest: ResultManifest, chunks: dict[int, bytes]) -> F32:
    """The trained parameters from a result's chunks, checked against the manifest."""
    missing = [i for i in range(manifest.chunks) if i not in chunks]
    if missing:
        raise ResultError(f"result of job {manifest.job}: {len(missing)} of {manifest.chunks} "
                          f"chunks missing (first: {missing[0]})")
    data = b"".join(chunks[i] for i in range(manifest.chunks))
    if len(data) != manifest.values * 4:
        raise ResultError(f"result of job {manifest.job}: {len(data)} bytes, the manifest says "
                          f"{manifest.values} float32 values ({manifest.values * 4} bytes)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.params_sha256:
        raise ResultError(f"result of job {manifest.job}: sha256 {digest[:16]}... of the chunks "
                          f"is not the manifest's {manifest.params_sha256[:16]}...")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)
