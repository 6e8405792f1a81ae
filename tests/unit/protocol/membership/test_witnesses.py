"""The fleet's evidence of silence (agent/protocol/membership/witnesses.py), without a
Membership around it: a report counts after its grace unless refuted, a backlog holds it, and
a majority found "silent" at once is a congested broker, not frozen nodes."""

from __future__ import annotations

from agent.protocol.allreduce import DOWNLINK_BUSY_HOLD
from agent.protocol.membership.witnesses import SuspicionRound, Witnesses, suspicion_round
from agent.protocol.messages import Suspect

ONLINE = {n: "online" for n in range(7)}
SEVEN = set(range(7))


def test_a_report_unrefuted_for_the_grace_suspects_its_peer_until_it_speaks() -> None:
    witnesses = Witnesses(node=0, grace=0.5)
    assert witnesses.record(Suspect(1, 3, 4), now=1.0, round=3)
    witnesses.evict(1.4, 3, ONLINE, SEVEN)
    assert witnesses.suspected() == frozenset() and witnesses.pending(1.4) == [1.5]
    witnesses.evict(1.5, 3, ONLINE, SEVEN)
    assert witnesses.suspected() == {4} and witnesses.unrefuted(1.5) == [(4, 3)]
    witnesses.spoke(4)
    assert witnesses.suspected() == frozenset() and witnesses.refuted == {(4, 1): 3}
    assert not witnesses.record(Suspect(1, 2, 4), now=2.0, round=3)  # older than what it refuted


def test_a_backlog_at_the_report_holds_it_longer() -> None:
    witnesses = Witnesses(node=0, grace=0.5)
    witnesses.record(Suspect(1, 3, 4), now=1.0, round=3)
    witnesses.peer_busy(4, 1.0)  # its PROGRESS: a large frame still arriving on its downlink
    assert witnesses.stands_until(4, 1.0) == 1.5 + DOWNLINK_BUSY_HOLD


def test_a_majority_reported_at_once_is_nobodys_eviction() -> None:
    witnesses = Witnesses(node=0, grace=0.0)
    for peer in (3, 4, 5, 6):
        witnesses.record(Suspect(1, 3, peer), now=1.0, round=3)
    witnesses.evict(2.0, 3, ONLINE, SEVEN)
    assert witnesses.suspected() == frozenset()


def test_reports_are_weighed_for_our_round_and_the_next_and_expire_after_two() -> None:
    assert suspicion_round(5, 5) is SuspicionRound.TIMELY and suspicion_round(6, 5) is SuspicionRound.TIMELY
    assert suspicion_round(7, 5) is SuspicionRound.AHEAD and suspicion_round(2, 5) is SuspicionRound.EXPIRED
    witnesses = Witnesses(node=0, grace=0.5)
    assert witnesses.judge(Suspect(1, 9, 4), round=5) == "suspect_future_round"
    assert witnesses.judge(Suspect(1, 9, 0), round=5) is None  # about us: ours to learn from
