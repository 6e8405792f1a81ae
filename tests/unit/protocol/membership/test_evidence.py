"""Evidence, not assertions (membership/evidence.py): signed control messages, and the
certificate a view needs to drop a member for silence or to change its coordinator."""

from __future__ import annotations

from dataclasses import replace

from agent.protocol.keys import MemberKeys, new_private_key, public_of
from agent.protocol.membership import Membership
from agent.protocol.membership.evidence import (
    Certificate,
    Signature,
    SignedReports,
    certified,
    co_signs,
    evidence_of,
    seal,
    signature,
)
from agent.protocol.messages import Status, Suspect, View

START = View(epoch=0, members=[0, 1, 2, 3], arity=2, coordinator=0, from_round=0)
PRIVATE = {i: new_private_key() for i in range(5)}
RING = {i: public_of(k) for i, k in PRIVATE.items() if i < 4}  # node 4 has no key in the job
KEYS = {i: MemberKeys.of_private(i, k, RING) for i, k in PRIVATE.items()}


def signed_suspect(reporter: int, round: int, peer: int) -> Suspect:
    return seal(KEYS[reporter], Suspect(reporter, round, peer))


def fleet_member(node: int, round: int = 20) -> Membership:
    m = Membership(node, 2, START, grace=1.0, keys=KEYS[node])
    for i in range(4):
        m.on_status(Status(i, "online", round=round), 0.0)
    m.round_started(round, 0.0)
    return m


def test_a_signature_is_checked_against_the_ring_and_refused_by_reason() -> None:
    status = seal(KEYS[1], Status(1, "online"))
    assert signature(KEYS[0], status, 1) is Signature.VALID
    assert signature(KEYS[0], Status(1, "online"), 1) is Signature.UNSIGNED
    assert signature(KEYS[0], replace(status, round=9), 1) is Signature.BAD_SIGNATURE  # altered
    assert signature(KEYS[0], seal(KEYS[2], Status(1, "online")), 1) is Signature.BAD_SIGNATURE  # 2's key
    assert signature(KEYS[0], seal(KEYS[4], Status(4, "online")), 4) is Signature.UNKNOWN_KEY
    assert signature(KEYS[0], replace(status, sig="!!"), 1) is Signature.BAD_SIGNATURE


def test_a_certificate_needs_a_quorum_of_the_remaining_members_with_recent_signed_reports() -> None:
    view = View(1, [1, 2, 3], 2, 1, 22)
    one = evidence_of([signed_suspect(1, 20, 0)])
    assert certified(KEYS[2], replace(view, evidence=one), 0, 20) is Certificate.TOO_FEW
    two = evidence_of([signed_suspect(1, 20, 0), signed_suspect(2, 20, 0)])
    assert certified(KEYS[2], replace(view, evidence=two), 0, 20) is Certificate.CERTIFIED
    # Replayed: the same two from long ago prove nothing about now.
    assert certified(KEYS[2], replace(view, evidence=two), 0, 40) is Certificate.STALE
    forged = [{**e, "node": 3} if e["node"] == 2 else e for e in two]  # 2's signature as 3's
    assert certified(KEYS[2], replace(view, evidence=forged), 0, 20) is Certificate.TOO_FEW
    unknown = evidence_of([signed_suspect(1, 20, 0), seal(KEYS[4], Suspect(4, 20, 0))])
    assert certified(KEYS[2], View(1, [1, 2, 3, 4], 2, 1, 22, evidence=unknown), 0, 20) is Certificate.TOO_FEW


def test_one_suspicion_and_one_view_do_not_take_the_coordinator_over() -> None:
    """Issue 54: node 1 reports the coordinator silent for the next round and publishes a view
    naming itself coordinator; before, node 0 yielded (next in line) and everybody followed."""
    report = signed_suspect(1, 21, 0)
    takeover = seal(KEYS[1], View(1, [1, 2, 3], 2, 1, 21, evidence=evidence_of([report])))
    coordinator, member = fleet_member(0), fleet_member(2)
    for m in (coordinator, member):
        m.on_suspect(report, 0.1)
    assert coordinator.offer_view(takeover, 1) == "view_removal_uncertified"
    assert coordinator.views.newest == START and coordinator.coordinator() == 0
    assert member.offer_view(takeover, 1) == "view_not_coordinator"
    # Even where node 0's refutation came too late (the report stood its grace), it stays out.
    member.check(10.0)
    assert member.coordinator() == 1 and member.views.newest == START
    member.on_status(Status(3, "online", round=20), 10.1)  # retries what it held: still no
    assert member.views.newest == START


def test_a_silent_coordinator_is_dropped_with_the_fleets_signed_reports() -> None:
    """The honest case: node 0 froze, nodes 1 and 2 signed their reports (2's as it found 0
    silent by the witnesses): node 1 coordinates, its view carries both, everybody takes it."""
    one, two, old = fleet_member(1), fleet_member(2), fleet_member(0)
    reports = [signed_suspect(1, 20, 0), signed_suspect(2, 20, 0)]
    assert one.on_suspect(reports[0], 0.0) == []
    assert one.check(5.0) == []  # suspected, but one signer is no certificate
    assert one.witnesses.suspected() == {0} and one.views.newest == START
    out = one.on_suspect(reports[1], 5.1)
    view = out[0].view
    assert view.members == [1, 2, 3] and view.coordinator == 1 and len(view.evidence) == 2
    for r in reports:
        two.on_suspect(r, 0.0)
    two.check(10.0)
    assert two.offer_view(seal(KEYS[1], view), 1) is None and two.views.newest.coordinator == 1
    old.on_suspect(reports[0], 0.0)  # resumed from its freeze, it learns it is out
    assert old.offer_view(seal(KEYS[1], view), 1) is None and old.views.newest.coordinator == 1


def test_a_view_changing_coordinator_over_a_live_one_that_stays_needs_proof() -> None:
    m = fleet_member(2)
    m.on_suspect(signed_suspect(1, 20, 0), 0.0)
    m.check(10.0)  # 0 suspected here: 1 is our coordinator
    assert m.offer_view(View(1, [0, 1, 2, 3], 2, 1, 22), 1) == "view_coordinator_uncertified"


def test_the_signed_reports_keep_the_latest_per_reporter_and_forget_old_rounds() -> None:
    book = SignedReports()
    book.heard(Suspect(1, 20, 0))  # unsigned: no evidence
    book.heard(signed_suspect(1, 19, 0))
    book.heard(signed_suspect(1, 20, 0))
    book.heard(signed_suspect(2, 20, 0))
    assert [r.round for r in book.certificate(0, [1, 2, 3], 20) or []] == [20, 20]
    assert book.certificate(0, [1, 2, 3, 4, 5], 20) is None
    book.forget_before(40)
    assert book.about == {}


def test_a_suspicion_its_suspect_refuted_is_no_evidence() -> None:
    """Node 2's honest report about node 0 in a slow moment, refuted by node 0: replayed with
    node 1's own in a view, it must not take node 0 out for the members who saw it refuted."""
    honest, own = signed_suspect(2, 20, 0), signed_suspect(1, 21, 0)
    view = seal(KEYS[1], View(1, [1, 2, 3], 2, 1, 22, evidence=evidence_of([honest, own])))
    member = fleet_member(3)
    member.on_suspect(honest, 0.0)
    member.on_status(Status(0, "online", round=20), 0.1)  # node 0 speaks: refuted
    assert member.witnesses.refuted[(0, 2)] == 20
    member.on_suspect(own, 0.2)
    member.check(10.0)  # node 1's report stood: 1 coordinates here, but its certificate is short
    assert member.coordinator() == 1
    assert member.offer_view(view, 1) == "view_removal_uncertified"


def test_we_sign_a_report_of_our_own_only_after_a_round_deadline_of_silence() -> None:
    assert not co_signs(0.5, 3.0) and co_signs(3.0, 3.0)
    m = fleet_member(2)
    m.evidence.heard_from(0, 10.0)
    assert m.evidence.quiet_for(0, 12.0) == 2.0 and m.evidence.quiet_for(9, 12.0) == float("inf")


def test_in_the_first_rounds_a_member_never_seen_going_needs_a_certificate_too() -> None:
    """Round 3: "went offline within EVIDENCE_ROUNDS" must not hold for a node that never did."""
    m = fleet_member(2, round=3)
    m.on_suspect(signed_suspect(1, 3, 0), 0.0)
    m.check(10.0)
    assert m.offer_view(seal(KEYS[1], View(1, [1, 2, 3], 2, 1, 5)), 1) == "view_removal_uncertified"
