"""The rows of a run's report: one per round, one per fault (report.py fills them, plots.py
draws them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundRow:
    round: int
    reporters: int = 0
    members: int = 0
    loss: float | None = None
    accuracy: float | None = None
    allreduce_s_max: float = 0.0
    allreduce_s_median: float = 0.0
    round_s_max: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    reroutes: int = 0
    timeouts: int = 0
    nacks: int = 0
    missing_chunks: int = 0
    degraded_nodes: int = 0
    distinct_hashes: int = 0
    faults_active: str = ""
    # Frames of values the agents sent, by wire format: "float32:4 int8:20" (see wire_frames_text)
    wire_frames: str = ""
    # From the moment the last agent had its gradient to the moment the last agent had the
    # result (see after_last_gradient); None when an agent did not say when its round ended.
    after_last_gradient_s: float | None = None
    # Periodic averaging: optimizer steps per agent behind the round (1: every-step averaging),
    # training samples the reporters' contributions cover, the median compute phase (the local
    # steps) and the bytes sent per sample trained (None: no agent said its samples).
    local_steps: int = 1
    samples: int = 0
    compute_s_median: float = 0.0
    bytes_per_sample: float | None = None
    dp_epsilon: float | None = None  # differential privacy: the most any reporter's data spent so far


@dataclass
class FaultOutcome:
    index: int
    kind: str
    description: str
    mechanism: str
    status: str  # injected | skipped | not_reached
    at_round: int | None = None
    end_round: int | None = None  # the round at which it was undone (None: lasted to the end)
    injected_t: float | None = None
    detected: bool = False
    evidence: str = ""
    targets: list[int] = field(default_factory=list)
