"""Per-peer retransmission timeouts, estimated like TCP's RTO (RFC 6298).

``LinkEstimators`` belongs to the runtime and outlives rounds, so what a round learns about
a link (its round-trip time, or that it is dead) serves the next one. Samples are taken
only from frames sent once (Karn's rule), by the round machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.125
BETA = 0.25


@dataclass
class LinkEstimate:
    srtt: float | None = None
    rttvar: float = 0.0
    samples: int = 0

    def observe(self, rtt: float) -> None:
        rtt = max(0.0, rtt)
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = (1 - BETA) * self.rttvar + BETA * abs(self.srtt - rtt)
            self.srtt = (1 - ALPHA) * self.srtt + ALPHA * rtt
        self.samples += 1


@dataclass
class LinkEstimators:
    """RTO per peer: srtt + 4 * rttvar, clamped to [min_timeout, max_timeout].

    ``fixed`` (seconds) replaces every estimate by one constant, to reproduce the thesis
    tables. ``round_time`` is a smoothed duration of clean rounds (no timeout, not degraded),
    which tells a node how long to wait for a broadcast before it starts to pull. ``dead``
    holds peers whose direct link timed out and has not carried a round trip since (a probe
    answered, an ACK): the next rounds route around them from the start instead of paying
    the timeout again.
    """

    min_timeout: float = 0.02
    max_timeout: float = 2.0
    initial_timeout: float = 0.5
    fixed: float | None = None
    peers: dict[int, LinkEstimate] = field(default_factory=dict)
    round_time: float | None = None
    dead: set[int] = field(default_factory=set)

    def rto(self, peer: int) -> float:
        if self.fixed is not None:
            return self.fixed
        est = self.peers.get(peer)
        if est is None or est.srtt is None:
            return self.initial_timeout
        raw = est.srtt + max(4 * est.rttvar, 0.001)
        return min(self.max_timeout, max(self.min_timeout, raw))

    def observe(self, peer: int, rtt: float) -> None:
        self.peers.setdefault(peer, LinkEstimate()).observe(rtt)

    def observe_round(self, seconds: float) -> None:
        if self.round_time is None:
            self.round_time = seconds
        else:
            self.round_time = 0.8 * self.round_time + 0.2 * seconds

    def mark_dead(self, peer: int) -> None:
        self.dead.add(peer)

    def heal(self, peer: int) -> bool:
        """A round trip with ``peer`` worked: its link lives. True if it was dead."""
        if peer not in self.dead:
            return False
        self.dead.discard(peer)
        return True
