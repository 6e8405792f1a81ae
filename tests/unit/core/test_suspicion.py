"""The suspicion book (agent/core/suspicion.py): what one agent reported, was told and answered."""

from __future__ import annotations

from agent.core.suspicion import FLOOD_REFUSED, FLOOD_STATUS_EVERY, SuspicionBook, first_report_at
from agent.protocol.messages import Suspect


def test_a_silent_peer_is_reported_once_per_round() -> None:
    book = SuspicionBook(node=1, incarnation=5)
    assert book.silent(3, 7) == Suspect(1, 7, 3, 5)
    assert book.silent(3, 7) is None
    assert book.silent(3, 8) == Suspect(1, 8, 3, 5)
    book.forget_before(8)
    assert book.silent(3, 7) == Suspect(1, 7, 3, 5)  # forgotten: news again


def test_our_absence_is_said_when_it_reaches_further_and_never_for_rounds_behind_us() -> None:
    book = SuspicionBook(node=1, incarnation=5)
    assert book.absence(4, round=6) is None  # those rounds are behind us
    assert book.absence(9, round=6) == Suspect(1, 9, 1, 5)
    assert book.absence(8, round=6) is None and book.absence(9, round=6) is None
    assert book.absent_in(9) and not book.absent_in(10)
    assert book.absence_again() == Suspect(1, 9, 1, 5)


def test_a_peers_absence_is_news_only_when_it_reaches_further() -> None:
    book = SuspicionBook(node=1, incarnation=5)
    assert book.peer_absent(3, 4)
    assert not book.peer_absent(3, 4) and not book.peer_absent(3, 2)
    assert book.peer_absent(3, 6) and book.peer_absent_in(3, 6) and not book.peer_absent_in(3, 7)
    assert not book.peer_absent(1, 9)  # our own self-report, back from the broker


def test_unrefuted_reports_excuse_a_peer_once_in_rounds_still_running_and_never_us() -> None:
    book = SuspicionBook(node=1, incarnation=5)
    unrefuted = [(3, 4), (3, 4), (1, 4), (2, 9), (3, 5)]  # two reporters of 3 in round 4
    assert book.to_excuse(unrefuted, running=[4, 5]) == [(3, 4), (3, 5)]
    assert book.to_excuse(unrefuted, running=[4, 5, 9]) == [(2, 9)]


def test_the_fleets_verdicts_are_news_once_and_again_after_they_were_lifted() -> None:
    book = SuspicionBook(node=1, incarnation=5)
    assert book.newly_suspected(frozenset({1, 3, 4})) == [3, 4]
    assert book.newly_suspected(frozenset({3, 4})) == []
    assert book.newly_suspected(frozenset({4})) == []
    assert book.newly_suspected(frozenset({3, 4})) == [3]


def test_a_report_about_us_is_refuted_once() -> None:
    book = SuspicionBook(node=1, incarnation=5)
    assert book.refute_once(0, 3) and not book.refute_once(0, 3) and book.refute_once(2, 3)


def test_the_first_report_about_a_peer_is_the_earliest_of_its_witnesses() -> None:
    reports = {3: {1: (7, 2.5), 2: (7, 2.1)}, 4: {}}
    assert first_report_at(reports, 3) == 2.1
    assert first_report_at(reports, 4) is None
    assert first_report_at(reports, 5) is None


def test_a_flood_of_refused_messages_calls_for_our_status_at_a_bounded_rate() -> None:
    """Garbage on our link delays or crowds out the reports about us: we say we live without
    waiting for them (issue 54), once per FLOOD_REFUSED refused and FLOOD_STATUS_EVERY s."""
    book = SuspicionBook(node=0, incarnation=5)
    assert not book.refused(FLOOD_REFUSED - 1, 1.0)
    assert book.refused(FLOOD_REFUSED, 1.0)
    assert not book.refused(3 * FLOOD_REFUSED, 1.0 + FLOOD_STATUS_EVERY / 2)  # too soon again
    assert book.refused(3 * FLOOD_REFUSED, 1.0 + FLOOD_STATUS_EVERY)
    assert not book.refused(3 * FLOOD_REFUSED + 1, 5.0)  # a trickle is no flood


def test_we_sign_our_own_report_about_a_suspected_peer_once_it_is_quiet_to_us() -> None:
    book = SuspicionBook(node=1, incarnation=5)
    book.to_co_sign |= {0, 3}
    quiet = {0: False, 3: True}
    assert book.co_sign_due(frozenset({0, 3}), quiet.__getitem__) == [3]
    assert book.co_sign_due(frozenset({3}), lambda _: True) == []  # 0 no longer suspected; 3 done
    assert book.to_co_sign == set()
