"""The suspicion book of one agent: what it reported, what it was told, what it answered.

A round machine finds a peer silent; the book says whether that is news to publish (once per
peer and round). Members report themselves absent from rounds they cannot take part in; the
book keeps the last round each said, and our own. Reports the fleet left unrefuted excuse a
peer in one round, and enough witnesses route around it everywhere: the book says which of
those are new. It also remembers which reports about us we refuted. Pure: no IO, no clock.

The membership (agent/protocol/membership.py) weighs the reports; this book keeps what this
agent did about them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from agent.protocol.messages import Suspect

# A flood of refused messages (garbage on our link, say) queues or crowds out the reports about
# us at the broker: we would refute them too late, and look silent. After this many refused, we
# say we live (our status) without waiting for a report, at most every FLOOD_STATUS_EVERY s.
FLOOD_REFUSED = 64
FLOOD_STATUS_EVERY = 0.1


class SuspicionBook:
    def __init__(self, node: int, incarnation: int) -> None:
        self.node, self.incarnation = node, incarnation
        self.reported: set[tuple[int, int]] = set()  # (peer, round) suspicions published
        # Self-reports: peer -> the last round it said it takes no part in; and our own.
        self.absent: dict[int, int] = {}
        self.absent_through = -1
        self.excused: set[tuple[int, int]] = set()  # (peer, round) no longer waited for
        self.down_seen: frozenset[int] = frozenset()  # suspected peers already routed around
        self.refuted: set[tuple[int, int]] = set()  # (reporter, round) reports answered
        self.to_co_sign: set[int] = set()  # suspected peers we have not signed a report of our own about
        self.refused_seen = 0  # messages refused (in all) when we last said our status for a flood
        self.flood_status_at = -1e18

    def silent(self, peer: int, round: int) -> Suspect | None:
        """A round machine heard nothing at all from ``peer`` for a whole timeout in
        ``round``: the report to publish, once per peer and round."""
        if (peer, round) in self.reported:
            return None
        self.reported.add((peer, round))
        return Suspect(self.node, round, peer, self.incarnation)

    def absence(self, through: int, round: int) -> Suspect | None:
        """We take no part in the rounds up to ``through`` (we are at ``round``): the
        self-report to publish, unless it says nothing new."""
        if through < round or through <= self.absent_through:
            return None
        self.absent_through = through
        return self.absence_again()

    def absence_again(self) -> Suspect:
        """Our last self-report, once more (the first may have been lost)."""
        return Suspect(self.node, self.absent_through, self.node, self.incarnation)

    def absent_in(self, round: int) -> bool:
        """We said we take no part in ``round``."""
        return round <= self.absent_through

    def peer_absent(self, peer: int, through: int) -> bool:
        """``peer`` says it takes no part in the rounds up to ``through``; True: news."""
        if peer == self.node or through <= self.absent.get(peer, -1):
            return False
        self.absent[peer] = through
        return True

    def peer_absent_in(self, peer: int, round: int) -> bool:
        return self.absent.get(peer, -1) >= round

    def to_excuse(self, unrefuted: Iterable[tuple[int, int]], running: Iterable[int]) -> list[tuple[int, int]]:
        """(peer, round) reports unrefuted for the grace, in rounds with a machine still
        (``running``), that no machine was told about yet."""
        rounds = set(running)
        fresh: list[tuple[int, int]] = []
        for peer, rnd in unrefuted:
            if peer != self.node and (peer, rnd) not in self.excused and rnd in rounds:
                self.excused.add((peer, rnd))
                fresh.append((peer, rnd))
        return fresh

    def newly_suspected(self, suspected: frozenset[int]) -> list[int]:
        """Peers the fleet's witnesses found silent that we did not route around yet."""
        fresh = sorted(suspected - self.down_seen - {self.node})
        self.down_seen = suspected
        return fresh

    def co_sign_due(self, suspected: frozenset[int], quiet: Callable[[int], bool]) -> list[int]:
        """Suspected peers to sign a report of our own about now (``quiet``: we heard nothing
        from it long enough); peers no longer suspected need none."""
        self.to_co_sign &= suspected
        due = sorted(p for p in self.to_co_sign if quiet(p))
        self.to_co_sign -= set(due)
        return due

    def refused(self, total: int, now: float) -> bool:
        """``total`` messages refused so far; True when a flood of them calls for our status now."""
        if total - self.refused_seen < FLOOD_REFUSED or now - self.flood_status_at < FLOOD_STATUS_EVERY:
            return False
        self.refused_seen, self.flood_status_at = total, now
        return True

    def refute_once(self, reporter: int, round: int) -> bool:
        """A report by ``reporter`` about us in ``round``: True the first time (answer it)."""
        if (reporter, round) in self.refuted:
            return False
        self.refuted.add((reporter, round))
        return True

    def forget_before(self, round: int) -> None:
        """What was reported, excused or refuted for rounds before ``round`` is kept no longer."""
        self.reported = {(p, r) for p, r in self.reported if r >= round}
        self.excused = {(p, r) for p, r in self.excused if r >= round}
        self.refuted = {(n, r) for n, r in self.refuted if r >= round}


def first_report_at(reports: Mapping[int, Mapping[int, tuple[int, float]]], peer: int) -> float | None:
    """When the first report standing about ``peer`` came (``Witnesses.reports``: suspect ->
    reporter -> (round, when)); None: none stands."""
    return min((t for _, t in reports.get(peer, {}).values()), default=None)
