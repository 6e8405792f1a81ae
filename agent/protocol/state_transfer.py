"""Full training-state transfer for a (re)joining, drifted or lagging node, over MODEL_PULL/MODEL.

The state is an opaque float32 vector (parameters + optimizer state, laid out by the runtime).
A node asks a live peer for the state at the start of round ``round`` (MODEL_PULL, payload =
missing chunk indices, empty = all). The peer answers, once it has reached that round, with
MODEL chunks labelled with the round whose start state they hold (``serve_model_pull``); the
puller assembles them, retries the missing chunks on the next peer when a peer stays silent
for ``timeout``, and ends with (round, state, params hash). The puller installs the state at a
round boundary, so it continues byte-identical with the fleet. ``resync_reason`` says when a
member must fetch the fleet's state after a round. Pure: frames and ``now`` in, actions out.
"""

from __future__ import annotations

import zlib

import numpy as np

from agent.protocol.allreduce import Action, Note, RoundResult, Send, chunk_bounds
from agent.protocol.wire import DType, Flag, Frame, Kind

# Values per MODEL frame when the runtime serves its state (256 KiB of float32).
STATE_CHUNK_VALUES = 1 << 16


def state_hash(values: np.ndarray) -> int:
    """32-bit hash of a float32 vector (the model hash of broadcast frames)."""
    return zlib.crc32(np.ascontiguousarray(values, dtype=np.float32).tobytes())


def resync_reason(result: RoundResult, own_hash: int) -> str | None:
    """Why this node's model no longer equals the fleet's after ``result``, or None.

    Chunks that fell back to the local value were applied as our own gradient, not the
    fleet's mean; a root hash unlike ours means we started the round from another model.
    """
    if result.missing_chunks:
        return f"{len(result.missing_chunks)} chunks fell back to the local value"
    if result.root_model_hash is not None and result.root_model_hash != own_hash:
        return f"{own_hash:08x} != root {result.root_model_hash:08x}"
    return None


def serve_model_pull(
    request: Frame, node: int, job: int, state: np.ndarray, round: int, chunk_size: int,
    params_hash: int = 0,
) -> list[Send]:
    """MODEL frames answering ``request`` with ``state`` (the state at the start of ``round``)."""
    state = np.asarray(state, dtype=np.float32)  # the copy must be exact: always float32
    bounds = chunk_bounds(len(state), chunk_size)
    wanted = request.indices() or list(range(len(bounds)))
    out: list[Send] = []
    for j in wanted:
        if not 0 <= j < len(bounds):
            continue
        lo, hi = bounds[j]
        frame = Frame(Kind.MODEL, job, round, node, j, len(bounds), Flag.NONE,
                      target=request.sender, model_hash=params_hash)
        out.append(Send(request.sender, frame.with_values(state[lo:hi])))
    return out


class StateTransfer:
    """Fetch the state at the start of ``round`` (or a later one) from ``peers``, in turn.

    ``size``, when given, is the state's length: an assembled state of another length is
    dropped (a peer with another model) and the missing state asked again of the next peer.
    """

    def __init__(self, node: int, job: int, round: int, peers: list[int], timeout: float,
                 now: float, size: int | None = None) -> None:
        if not peers:
            raise ValueError("a state transfer needs at least one peer")
        self.node, self.job, self.round = node, job, round
        self.peers = list(peers)
        self.timeout = timeout
        self.size = size
        self.peer_i = 0
        self.last_progress = now
        self.parts: dict[int, np.ndarray] = {}
        self.count: int | None = None
        self.state_round: int | None = None
        self.params_hash = 0
        self.attempts = 0
        self.result: tuple[int, np.ndarray, int] | None = None  # (round, state, params hash)

    @property
    def peer(self) -> int:
        return self.peers[self.peer_i % len(self.peers)]

    def start(self, now: float) -> list[Action]:
        return self._ask(now)

    def _ask(self, now: float) -> list[Action]:
        self.attempts += 1
        self.last_progress = now
        missing = [] if self.count is None else [j for j in range(self.count) if j not in self.parts]
        frame = Frame(Kind.MODEL_PULL, self.job, self.round, self.node, 0, 1).with_indices(missing)
        return [Note("state_pull", self.peer, f"attempt {self.attempts}"), Send(self.peer, frame)]

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        if self.result is not None or not self._wanted(frame):
            return []
        if self.state_round is not None and frame.round != self.state_round:
            if frame.round < self.state_round:
                return []
            self.parts.clear()  # a newer state: start over
            self.count = None
        self.state_round, self.count = frame.round, frame.chunk_count
        self.params_hash = frame.model_hash
        self.parts[frame.chunk_index] = frame.values()
        self.last_progress = now
        if len(self.parts) < self.count:
            return []
        state = np.concatenate([self.parts[j] for j in range(self.count)]).astype(np.float32)
        if self.size is not None and state.size != self.size:
            self.parts.clear()
            self.count = self.state_round = None
            return [Note("state_rejected", frame.sender, f"{state.size} values, expected {self.size}")]
        self.result = (frame.round, state, self.params_hash)
        return [Note("state_received", frame.sender, f"round {frame.round}")]

    def _wanted(self, frame: Frame) -> bool:
        """MODEL frames of our job holding an exact copy of a state as new as the one we asked
        for (older ones are late answers to an earlier transfer)."""
        return (frame.kind == Kind.MODEL and frame.job == self.job and frame.dtype == DType.F32
                and frame.round >= self.round)

    def reject(self, why: str, now: float) -> list[Action]:
        """The assembled state is unusable (the caller checked it): ask the next peer."""
        sender = self.peer
        self.result = None
        self.parts.clear()
        self.count = self.state_round = None
        self.peer_i += 1
        return [Note("state_rejected", sender, why), *self._ask(now)]

    def next_timer(self) -> float | None:
        return None if self.result is not None else self.last_progress + self.timeout

    def on_timer(self, now: float) -> list[Action]:
        if self.result is not None or now < self.last_progress + self.timeout:
            return []
        self.peer_i += 1
        return [Note("timeout", self.peers[(self.peer_i - 1) % len(self.peers)], "state transfer"),
                *self._ask(now)]
