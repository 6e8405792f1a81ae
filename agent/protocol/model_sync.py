"""Copying the full training state (params + optimizer state) from one agent to another.

A (re)joining or drifted agent sends MODEL_PULL; a member answers with MODEL frames that
carry its state as it stands at the START of round ``frame.round`` (before that round's
update). The puller installs it at a round boundary, so it continues byte-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agent.protocol.wire import DType, Frame, Kind

MODEL_CHUNK_VALUES = 1 << 16


def pull_frame(job: int, sender: int, round: int) -> Frame:
    return Frame(Kind.MODEL_PULL, job, round, sender)


def state_frames(job: int, sender: int, round: int, state: np.ndarray, model_hash: int) -> list[Frame]:
    """``state`` split into MODEL frames (float32: the copy must be exact)."""
    flat = np.asarray(state, dtype=np.float32)
    count = max(1, -(-flat.size // MODEL_CHUNK_VALUES))
    return [
        Frame(Kind.MODEL, job, round, sender, chunk_index=i, chunk_count=count,
              model_hash=model_hash).with_values(
            flat[i * MODEL_CHUNK_VALUES : (i + 1) * MODEL_CHUNK_VALUES], DType.F32)
        for i in range(count)
    ]


@dataclass
class StateAssembler:
    """Collects MODEL frames of one (sender, round) until the whole state of ``size`` is in."""

    size: int
    parts: dict[tuple[int, int], dict[int, np.ndarray]] = field(default_factory=dict)

    def add(self, frame: Frame) -> tuple[int, int, np.ndarray] | None:
        """Returns (round, model_hash, state) once complete; None while parts are missing.

        A frame whose sizes cannot add up to ``size`` is ignored (and so never completes).
        """
        if frame.kind != Kind.MODEL or frame.dtype != DType.F32:
            return None
        expected = -(-self.size // MODEL_CHUNK_VALUES)
        if frame.chunk_count != expected:
            return None
        key = (frame.sender, frame.round)
        chunks = self.parts.setdefault(key, {})
        chunks[frame.chunk_index] = frame.values()
        if len(chunks) < expected:
            return None
        del self.parts[key]
        state = np.concatenate([chunks[i] for i in range(expected)])
        if state.size != self.size:
            return None
        return frame.round, frame.model_hash, state

    def forget_before(self, round: int) -> None:
        self.parts = {k: v for k, v in self.parts.items() if k[1] >= round}
