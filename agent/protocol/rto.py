"""Per-peer retransmission timeouts, estimated like TCP's RTO (RFC 6298).

``LinkEstimators`` belongs to the runtime and outlives rounds, so what a round learns about
a link (its round-trip time, or that it is dead) serves the next one. Samples are taken
only from frames sent once (Karn's rule), by the round machines.

A link also has a byte rate: a 1 MB unit on a 6 MB/s link shared by two senders needs a third
of a second before the peer can ACK it, however short its round trip. ``rate`` is the smoothed
delivery rate the ACKs of large units showed, and ``transmit_time`` what the round machines
add to a unit's timeout for the bytes queued ahead of it (itself included), at the measured
rate, but never faster than ``rate_floor``: a link that was fast in the last round may be slow
now (Wi-Fi), and a unit declared lost while it still drains is resent into the same queue,
which is how a fleet on slow links collapses (issue 19).

A link measured far faster than the floor (loopback, wired Ethernet) counts on a
``RATE_HEADROOM``-th of its measured rate instead: the floor there would add half a second
per MB to every silence verdict, which is what a frozen peer costs the round it freezes in
(issue 12). A slower sample lowers the estimate at once (a link that slows down is believed
at once, one that speeds up slowly), so a link that drops by more than the headroom costs
one round of early verdicts, which a live peer refutes, and then runs on the floor again.

``typical_rate`` is what ``wire_dtype = "auto"`` picks a wire format from (agent/protocol/
wire_choice.py): the median of the link's last ``RATE_SAMPLES_KEPT`` drain samples (the bytes
of a whole busy stretch of the link over its duration, ``observe_drain``: single ACKs that
bunch up behind bulk data would show rates beyond the link's), not the down-at-once estimate
the timers use. A CPU stall on a loaded host only ever lowers a sample (the ACK comes late),
so one stall must not narrow the format; a link that is slow every time shows it in the
majority of its samples within a round or two (a leaf's link drains once a round).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

ALPHA = 0.125
BETA = 0.25
RATE_ALPHA = 0.25
MIN_RATE_SAMPLE_BYTES = 16_384  # smaller ACKed units measure the round trip, not the rate
# Timers count on 1/RATE_HEADROOM of a link's measured rate when that is above the floor: a
# link may get this much slower between two samples without a unit on it judged lost.
RATE_HEADROOM = 8.0
RATE_SAMPLES_KEPT = 5  # the last rate samples of a link that typical_rate takes the median of
# A peer's units reaching us are trusted to show its uplink from this many samples on: the first
# rounds count at the floor (a link slowed early, as a device's fault at round 1, is no silence).
INBOUND_SAMPLES_TRUSTED = 3


class RecentRates:
    """The latest rate samples of a link (bytes/s), oldest dropped first: the window both the
    wire format choice (``typical_rate``) and the fleet's chunk size (agent/protocol/chunking.py)
    read an order statistic from."""

    def __init__(self, keep: int) -> None:
        self._rates: deque[float] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._rates)

    def add(self, rate: float) -> None:
        self._rates.append(rate)

    def median(self) -> float | None:
        return statistics.median(self._rates) if self._rates else None

    def lower_quartile(self) -> float | None:
        return sorted(self._rates)[len(self._rates) // 4] if self._rates else None


@dataclass
class LinkEstimate:
    srtt: float | None = None
    rttvar: float = 0.0
    samples: int = 0
    rate: float | None = None  # bytes/s, smoothed delivery rate of large units
    # Seconds from our start of a round to this child's first frame in it: up at once, down
    # slowly (a slow round raises it for the next ones).
    first_frame: float | None = None
    drains: RecentRates = field(default_factory=lambda: RecentRates(RATE_SAMPLES_KEPT))
    # Bytes/s at which the peer's large frames followed each other to us: its uplink, as far
    # as we can see it (the broker passes a message on whole, so its own speed hides it).
    inbound: RecentRates = field(default_factory=lambda: RecentRates(RATE_SAMPLES_KEPT))

    def observe_first_frame(self, seconds: float) -> None:
        previous = self.first_frame if self.first_frame is not None else seconds
        self.first_frame = max(seconds, 0.8 * previous + 0.2 * seconds)

    def observe_rate(self, rate: float) -> None:
        # Down at once, up slowly: timers that trust a link too fast call a slow peer silent.
        if self.rate is None or rate < self.rate:
            self.rate = rate
        else:
            self.rate = (1 - RATE_ALPHA) * self.rate + RATE_ALPHA * rate

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
    which tells a node how long to wait for a broadcast before it starts to pull;
    ``round_peak`` the same but following a longer round at once (how long to wait for the
    contributions, with adaptive timeouts). ``dead``
    holds peers whose direct link timed out and has not carried a round trip since (a probe
    answered, an ACK): the next rounds route around them from the start instead of paying
    the timeout again.
    """

    min_timeout: float = 0.02
    max_timeout: float = 2.0
    initial_timeout: float = 0.5
    rate_floor: float = 2e6  # bytes/s: transmission times assume no faster a link
    fixed: float | None = None
    peers: dict[int, LinkEstimate] = field(default_factory=dict)
    round_time: float | None = None
    round_peak: float | None = None
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

    def measured_rtt(self, peer: int) -> float | None:
        """The smoothed round trip of the link, with fixed timeouts too (None: never
        measured): how long a reply through the broker takes now, however timeouts are set."""
        est = self.peers.get(peer)
        return None if est is None else est.srtt

    def is_measured(self, peer: int) -> bool:
        """A round trip with ``peer`` was measured (its RTO is not the initial guess)."""
        est = self.peers.get(peer)
        return est is not None and est.srtt is not None

    def rate(self, peer: int) -> float:
        """Bytes/s to count on towards ``peer``: the measured rate, at most ``rate_floor``,
        or a ``RATE_HEADROOM``-th of it on a link measured far faster than the floor."""
        est = self.peers.get(peer)
        return self._counted(None if est is None else est.rate)

    def _counted(self, measured: float | None) -> float:
        if measured is None:
            return self.rate_floor
        return max(min(self.rate_floor, measured), measured / RATE_HEADROOM)

    def typical_rate(self, peer: int) -> float | None:
        """The median of the link's recent drain samples in bytes/s (None: never measured),
        with fixed timeouts too: what our units usually drain at towards ``peer``."""
        est = self.peers.get(peer)
        return None if est is None else est.drains.median()

    def observe_first_frame(self, peer: int, seconds: float) -> None:
        self.peers.setdefault(peer, LinkEstimate()).observe_first_frame(max(0.0, seconds))

    def first_frame(self, peer: int) -> float | None:
        """How long after our start of a round ``peer``'s first frame in it has come lately
        (None: not measured yet, or fixed timeouts)."""
        est = self.peers.get(peer)
        return None if self.fixed is not None or est is None else est.first_frame

    def transmit_time(self, peer: int, nbytes: int) -> float:
        """How long ``nbytes`` queued towards ``peer`` take to drain (0 with fixed timeouts,
        which reproduce the thesis tables)."""
        if self.fixed is not None or nbytes <= 0:
            return 0.0
        return nbytes / self.rate(peer)

    def arrival_time(self, peer: int, nbytes: int, sharing: int = 1, headroom: bool = True) -> float:
        """How long ``nbytes`` from ``peer`` take to reach us while ``sharing`` peers send us
        as much (0 with fixed timeouts). Once trusted, at the rate its frames followed each
        other lately (the lower quartile): that shows its uplink and our share of the path
        alike, counted as ``rate`` counts it (``headroom``) or as measured. Else all
        ``sharing`` shares at our link's measured rate, or at the floor, counted so. Not at
        our downlink's rate: a device's slow uplink is not ours (a leaf on 2 MB/s among fast
        links was taken for silent every round)."""
        if self.fixed is not None or nbytes <= 0:
            return 0.0
        est = self.peers.get(peer)
        if est is not None and len(est.inbound) >= INBOUND_SAMPLES_TRUSTED:
            pace = est.inbound.lower_quartile()
            assert pace is not None
            return nbytes / (self._counted(pace) if headroom else pace)
        return nbytes * max(1, sharing) / self._counted(None if est is None else est.rate)

    def observe_inbound(self, peer: int, nbytes: int, seconds: float) -> None:
        """A large frame of ``nbytes`` from ``peer`` came ``seconds`` after its previous one in
        this round. Errs slow when the peer paused between them; read together after a stall
        of ours (0 s) it is not taken, and the lower quartile outvotes a few read late."""
        if nbytes >= MIN_RATE_SAMPLE_BYTES and seconds > 0:
            self.peers.setdefault(peer, LinkEstimate()).inbound.add(nbytes / seconds)

    def observe_rate(self, peer: int, nbytes: int, seconds: float) -> None:
        """``nbytes`` of units sent once were ACKed ``seconds`` after the link started on them."""
        if nbytes >= MIN_RATE_SAMPLE_BYTES and seconds > 0:
            self.peers.setdefault(peer, LinkEstimate()).observe_rate(nbytes / seconds)

    def observe_drain(self, peer: int, nbytes: int, seconds: float) -> None:
        """The link to ``peer`` drained ``nbytes`` of units sent once in ``seconds``: from the
        first unit sent onto the idle link to the ACK after which nothing was unACKed."""
        if nbytes >= MIN_RATE_SAMPLE_BYTES and seconds > 0:
            self.peers.setdefault(peer, LinkEstimate()).drains.add(nbytes / seconds)

    def observe_round(self, seconds: float) -> None:
        if self.round_time is None:
            self.round_time = self.round_peak = seconds
        else:
            self.round_time = 0.8 * self.round_time + 0.2 * seconds
            # Up at once, down slowly: it sets how long to wait for contributions, and a wait
            # too short costs a degraded round, one too long only time.
            self.round_peak = max(seconds, 0.8 * (self.round_peak or seconds) + 0.2 * seconds)

    def mark_dead(self, peer: int) -> None:
        self.dead.add(peer)

    def heal(self, peer: int) -> bool:
        """A round trip with ``peer`` worked: its link lives. True if it was dead."""
        if peer not in self.dead:
            return False
        self.dead.discard(peer)
        return True
