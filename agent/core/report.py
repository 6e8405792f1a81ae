"""What an agent says about each round: the report the core hands its driver and the
telemetry message the driver publishes from it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from agent.protocol.allreduce import Note, RoundResult
from agent.protocol.messages import Telemetry, View


@dataclass
class Counters:
    bytes_sent: int = 0
    bytes_received: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


@dataclass
class RoundReport:
    round: int
    epoch: int
    members: int
    loss: float
    result: RoundResult | None  # None: abandoned (the fleet was ahead)
    phase_seconds: dict[str, float]
    notes: list[Note]
    evaluate: bool = False
    accuracy: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    # The core clock's time when the round's allreduce ended (0: not said); the runtime turns
    # it into the wall-clock ``Telemetry.reduced_at``.
    ended_at: float = 0.0
    local_steps: int = 1  # optimizer steps whose result the round averaged (periodic: sync-every)
    samples: int = 0  # training samples behind this agent's contribution (the driver knows the batch)

    @property
    def degraded(self) -> bool:
        return self.result is None or self.result.degraded


def telemetry_for(node: int, counters: Counters, report: RoundReport, *, algorithm: str, model_hash: int,
                  wall_time: float, machine: str = "", reduced_at: float = 0.0,
                  cpu_percent: float | None = None, rss_bytes: int = 0) -> Telemetry:
    """The telemetry message of one reported round of ``node`` (``counters``: its core's);
    ``reduced_at``: the wall-clock time the round's allreduce ended (0: not said); ``cpu_percent``/``rss_bytes``: what the driver
    measured of its process (None/0: not said)."""
    result = report.result
    stats = result.stats if result is not None else None
    contributors = set().union(*result.contributors) if result is not None and result.contributors else set()
    return Telemetry(
        node=node, round=report.round, epoch=report.epoch, algorithm=algorithm,
        wall_time=wall_time, loss=_finite(report.loss), accuracy=report.accuracy,
        phase_seconds={k: round(v, 6) for k, v in report.phase_seconds.items()},
        bytes_sent=report.bytes_sent, bytes_received=report.bytes_received,
        contributors=len(contributors), members=report.members,
        reroutes=stats.reroutes if stats else 0, timeouts=stats.timeouts if stats else 0,
        nacks=stats.nacks if stats else 0, pulls=stats.pulls if stats else 0,
        retransmits=stats.retransmits if stats else 0,
        wire_frames=dict(stats.wire_frames) if stats else {},
        degraded=report.degraded,
        missing_chunks=len(result.missing_chunks) if result is not None else 0,
        rejected=dict(counters.rejected),
        links={str(k): v for k, v in result.link_states.items()} if result is not None else {},
        model_hash=f"{model_hash:08x}",
        events=[{"kind": n.kind, "peer": n.peer, "detail": n.detail} for n in report.notes][:50],
        machine=machine, reduced_at=reduced_at, local_steps=report.local_steps, samples=report.samples,
        cpu_percent=cpu_percent, rss_bytes=rss_bytes,
    )


def _finite(value: float) -> float | None:
    """JSON has no NaN: a diverged loss travels as null."""
    return value if np.isfinite(value) else None


@dataclass
class RoundInProgress:
    """The round this agent runs: its view and what it measured so far."""

    view: View
    started: float
    waited: float = 0.0  # blocked before it could start (a dead root's tree, no connection)
    computed: float = 0.0
    loss: float = 0.0
    own_hash: int = 0
    gradient: np.ndarray | None = None  # kept: a newer view for this round restarts it
    bytes_sent: int = 0
    bytes_received: int = 0

    def report(self, round: int, result: RoundResult | None, notes: list[Note], counters: Counters,
               now: float) -> RoundReport:
        computed = self.computed or now
        seconds = {"compute": computed - self.started, "allreduce": now - computed,
                   "wait": self.waited, "total": now - self.started + self.waited}
        return RoundReport(
            round=round, epoch=self.view.epoch, members=len(self.view.members),
            loss=self.loss, result=result, phase_seconds=seconds, notes=notes,
            bytes_sent=counters.bytes_sent - self.bytes_sent,
            bytes_received=counters.bytes_received - self.bytes_received, ended_at=now)
