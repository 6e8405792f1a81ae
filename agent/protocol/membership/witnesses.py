"""The fleet's evidence of silence: reports that a member heard nothing from a peer, and the
verdict they reach. The one place that decides a peer is silent for the fleet (``suspected``).

A node that heard nothing at all from a peer for a whole timeout (a link declared dead, a silent
child, a relay through it unanswered) publishes a ``Suspect`` to every member. A node that is
alive and sees a report about itself refutes it at once by publishing its status: the broker
still hears it, so only its links are slow or cut. A node is *suspected* when a report about it
(from a member, within ``SUSPICION_ROUNDS`` rounds) stood unrefuted for ``grace`` seconds
(``DOWNLINK_BUSY_HOLD`` more while our own links show a backlog at the report: the refutation
may wait behind a large frame, or the suspect's: its PROGRESS): then it is silent to the broker
too, frozen or cut off. One witness is enough because the suspect itself is asked; a lossy or
cut link, or cut links all around a healthy node, are refuted and evict nobody. So that a
congested broker (late refutations) cannot empty the fleet, never more than a minority is
suspected within ``EVICTION_WINDOW_ROUNDS`` rounds (one at a time, each against a view already
shrunk, it did). Suspicion ends when the node speaks again at the fleet's round, or announces
that it rejoins; reports expire after ``SUSPICION_ROUNDS``.
"""

from __future__ import annotations

import enum

from agent.protocol.allreduce import BUSY_AT_REPORT, DOWNLINK_BUSY_HOLD
from agent.protocol.messages import Suspect
from agent.protocol.wire import RejectReason

SUSPICION_ROUNDS = 2  # a report counts for the round it names and this many after
SUSPICION_RTTS = 2.0  # a report stands at least this many of the links' round trips (refutation)
# Evictions by suspicion this many rounds apart count together against the minority bound:
# one at a time, a congested broker's late refutations emptied a 7-agent fleet in 1 s.
EVICTION_WINDOW_ROUNDS = 8


class SuspicionRound(enum.Enum):
    """Where a report's round lies against ours (``suspicion_round``)."""

    TIMELY = "timely"  # ours, the next, or up to SUSPICION_ROUNDS before ours: weighed
    EXPIRED = "expired"  # older: ignored (a late honest report)
    AHEAD = "ahead"  # beyond the next round: refused, counted


def suspicion_round(report_round: int, our_round: int) -> SuspicionRound:
    """Members run the same round or the next, so a report of silence names one of them. One
    far ahead stood "within SUSPICION_ROUNDS" for ever: repeated, it evicted healthy nodes
    one after another, the coordinator too, and split the fleet."""
    if report_round + SUSPICION_ROUNDS < our_round:
        return SuspicionRound.EXPIRED
    return SuspicionRound.AHEAD if report_round > our_round + 1 else SuspicionRound.TIMELY


class Witnesses:
    def __init__(self, node: int, grace: float) -> None:
        self.node = node
        self.grace = grace  # how long a report stands unrefuted before it counts
        self.reports: dict[int, dict[int, tuple[int, float]]] = {}  # suspect -> reporter -> (round, when)
        self.evicted: set[int] = set()  # suspected; until the node itself speaks again
        self.evicted_in: dict[int, int] = {}  # node -> our round when it was last suspected
        self.reported_in: dict[int, int] = {}  # node -> the latest round it was reported silent in
        self.refuted: dict[tuple[int, int], int] = {}  # (suspect, reporter) -> latest round it refuted
        self.links_busy_at = -1e18  # when our own links last showed a backlog (see links_busy)
        self.peer_busy_at: dict[int, float] = {}  # node -> when its PROGRESS last said its downlink was busy

    def judge(self, report: Suspect, round: int) -> RejectReason | None:
        """Why a report of silence is refused (None: weighed, or simply expired). A report
        about us is kept whatever its round: the fleet may be far ahead (we hung), and that
        it went on without us is ours to learn (Membership.offer_view). The same report again
        after its suspect refuted it is no new evidence: repeated, it evicted the suspect,
        which answers each reporter's round once."""
        if report.peer == self.node or report.node == report.peer:
            return None
        if suspicion_round(report.round, round) is SuspicionRound.AHEAD:
            return RejectReason.SUSPECT_FUTURE_ROUND
        if report.round == self.refuted.get((report.peer, report.node)):
            return RejectReason.SUSPECT_REFUTED
        return None

    def record(self, report: Suspect, now: float, round: int) -> bool:
        """A member heard nothing from ``report.peer`` for a whole timeout: False when the
        report is no evidence (refused, expired, refuted since)."""
        if (report.node == report.peer or self.judge(report, round) is not None
                or suspicion_round(report.round, round) is SuspicionRound.EXPIRED
                or report.round < self.refuted.get((report.peer, report.node), -1)):
            return False
        by = self.reports.setdefault(report.peer, {})
        earlier = by.get(report.node)
        if earlier is not None and earlier[0] + SUSPICION_ROUNDS >= round:
            # The same witness again (its machine of another round, lingering for the peer's
            # ACKs, timed out too): the suspicion stands since its first report. Restarting
            # the grace here kept a frozen leaf's next round waiting twice as long.
            by[report.node] = (max(report.round, earlier[0]), earlier[1])
        else:
            by[report.node] = (report.round, now)
        self.reported_in[report.peer] = max(report.round, self.reported_in.get(report.peer, report.round))
        return True

    def spoke(self, node: int) -> None:
        """``node`` speaks again at the fleet's round: every report about it is refuted."""
        for reporter, (rnd, _) in self.reports.pop(node, {}).items():
            key = (node, reporter)
            self.refuted[key] = max(rnd, self.refuted.get(key, -1))
        self.evicted.discard(node)

    def links_busy(self, now: float) -> None:
        """Our downlink is busy with a large frame, or what we published waits to leave: a
        refutation may wait behind it (and the suspect's downlink may hold our report)."""
        self.links_busy_at = now

    def peer_busy(self, node: int, now: float) -> None:
        """``node``'s PROGRESS: a large frame is still arriving on its downlink (it lives, and
        a report about it may wait behind that frame before it can refute it)."""
        self.peer_busy_at[node] = now

    def stands_until(self, suspect: int, heard: float) -> float:
        """When a report about ``suspect`` heard at ``heard`` counts, unrefuted: ``grace`` later,
        DOWNLINK_BUSY_HOLD more if our links or the suspect's downlink show a backlog at the
        report (BUSY_AT_REPORT before it, or later; not the last round's result read slowly by
        a node cut off right after it). On 2 MB/s links an accused inner node heard the report
        behind its leaves' units, after the grace, and was dropped (2 of 2 runs of int8); the
        suspect's PROGRESS saved it (0 of 3), our own links' backlog alone did not."""
        busy = max(self.links_busy_at, self.peer_busy_at.get(suspect, -1e18))
        return heard + self.grace + (DOWNLINK_BUSY_HOLD if busy >= heard - BUSY_AT_REPORT else 0.0)

    def suspected(self) -> frozenset[int]:
        """Nodes enough distinct members reported silent (see the module's rule), until they
        speak again."""
        return frozenset(self.evicted)

    def unrefuted(self, now: float) -> list[tuple[int, int]]:
        """(peer, round) of every report that stood unrefuted for ``grace``: within that
        round nobody needs to wait for the peer's contribution any more."""
        return [(peer, rnd) for peer, by in self.reports.items() for rnd, t in by.values()
                if self.stands_until(peer, t) <= now]

    def pending(self, now: float) -> list[float]:
        """When the reports still in their grace count."""
        return [at for peer, by in self.reports.items() if peer not in self.evicted
                for _, t in by.values() if (at := self.stands_until(peer, t)) > now]

    def reported_lately(self, node: int, round: int) -> bool:
        """``node`` was reported silent within SUSPICION_ROUNDS of ``round``."""
        return any(rnd + SUSPICION_ROUNDS >= round for rnd, _ in self.reports.get(node, {}).values())

    def evict(self, now: float, round: int, states: dict[int, str], known: set[int]) -> None:
        """Suspect the nodes whose reports stood their grace (``known``: the newest view's
        members, or every node heard of without a view)."""
        for node in self._witnessed(now, round, states, known) - self.evicted:
            self.evicted.add(node)
            self.evicted_in[node] = round

    def _witnessed(self, now: float, round: int, states: dict[int, str], known: set[int]) -> set[int]:
        out: set[int] = set()
        for peer, by in self.reports.items():
            if peer == self.node:
                continue  # reports about us are for the others to judge (see offer_view)
            if any(rnd + SUSPICION_ROUNDS >= round and self.stands_until(peer, t) <= now
                   and states.get(r) == "online" for r, (rnd, t) in by.items()):
                out.add(peer)
        # Those suspected lately count even when they spoke since (each refuted too late: a
        # congested broker), and so do the members they were, however the views shrank.
        recent = {n for n, r in self.evicted_in.items() if r + EVICTION_WINDOW_ROUNDS >= round}
        members = known | self.evicted | recent
        if len((self.evicted | out | recent) & members) * 2 >= len(members):
            return set()  # a majority "silent" is a congested broker, not frozen nodes
        return out
