"""Evidence, not assertions: signed control messages and the certificates views carry.

Every member signs its statuses, suspicions and views with its device key (keys.py); a
receiver refuses one that is unsigned or badly signed (``signature``), counted by reason. A
view that drops a member for silence carries the signed suspicions about it, from more than
half of the view's members (or exactly half with the lowest of them: docs/PARTITIONS.md's
quorum rule), each for a recent round (``certified``). A member that finds a peer silent by
the fleet's witnesses signs a suspicion of its own about it (the core publishes it), so the
coordinator can collect a certificate for an honest eviction (``SignedReports``), while one
device's word (a suspicion and a view of its own) is never enough to drop anybody, the
coordinator least of all. Pure: no IO, no clock.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TypeVar

from agent.protocol.keys import MemberKeys
from agent.protocol.membership.quorum import LEAD_ROUNDS, keeps_quorum
from agent.protocol.membership.witnesses import SUSPICION_ROUNDS
from agent.protocol.messages import Signed, Status, Suspect, View, sealed_bytes, suspect_of

# A suspicion in a certificate names a round this close to ours: the view applies LEAD_ROUNDS
# after its coordinator's round, and a report counts SUSPICION_ROUNDS after its own. An older
# one, replayed, proves nothing about now.
EVIDENCE_ROUNDS = SUSPICION_ROUNDS + LEAD_ROUNDS

S = TypeVar("S", Status, Suspect, View)


class Signature(enum.Enum):
    """What a control message's signature says (the reason a refusal is counted by)."""

    VALID = "valid"
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"  # its signer has no key in the job's ring
    BAD_SIGNATURE = "bad_signature"


class Certificate(enum.Enum):
    """Whether a view's evidence justifies dropping one member."""

    CERTIFIED = "certified"
    TOO_FEW = "too_few"  # fewer valid, recent signers than the quorum
    STALE = "stale"  # enough signers only counting suspicions of rounds long past (a replay)


def co_signs(quiet_for: float, round_deadline: float) -> bool:
    """Whether we sign a suspicion of our own about a peer the fleet's witnesses found silent:
    only once we ourselves heard nothing at all from it for a whole round deadline (no round
    can finish without it for that long). A report standing its grace is not enough: a busy
    root that refuted one device's suspicion late (a loaded host, a flooded link) would
    otherwise get the attacker its certificate."""
    return quiet_for >= round_deadline


def seal(keys: MemberKeys, message: S) -> S:
    """``message`` signed with our device key."""
    signature = keys.sign(sealed_bytes(message))
    return replace(message, sig=base64.b64encode(signature).decode())


def signature(keys: MemberKeys, message: Signed, signer: int) -> Signature:
    """Whether ``message`` carries ``signer``'s valid signature."""
    if not message.sig:
        return Signature.UNSIGNED
    if not keys.knows(signer):
        return Signature.UNKNOWN_KEY
    try:
        raw = base64.b64decode(message.sig, validate=True)
    except (binascii.Error, ValueError):
        return Signature.BAD_SIGNATURE
    return Signature.VALID if keys.verify(signer, sealed_bytes(message), raw) else Signature.BAD_SIGNATURE


def certified(keys: MemberKeys, view: View, node: int, round: int,
              refuted: Callable[[Suspect], bool] = lambda _: False) -> Certificate:
    """Whether ``view``'s evidence drops ``node`` rightly as seen at our ``round``: signed
    suspicions about it, each valid, not ``refuted`` (its suspect spoke after it: a slow
    moment, not silence) and about a round within EVIDENCE_ROUNDS of ours, from a quorum of
    the view's members."""
    recent: set[int] = set()
    old: set[int] = set()
    for report in _reports(view.evidence):
        if report.peer != node or report.node not in view.members or report.is_self_report or refuted(report):
            continue
        if signature(keys, report, report.node) is not Signature.VALID:
            continue
        fresh = round - EVIDENCE_ROUNDS <= report.round <= round + 1
        (recent if fresh else old).add(report.node)
    if keeps_quorum(view.members, recent):
        return Certificate.CERTIFIED
    return Certificate.STALE if keeps_quorum(view.members, recent | old) else Certificate.TOO_FEW


def _reports(evidence: Iterable[dict[str, object]]) -> list[Suspect]:
    return [r for entry in evidence if (r := suspect_of(dict(entry))) is not None]


class SignedReports:
    """The signed suspicions heard lately, the latest of each reporter about each peer: what a
    coordinator's certificate is made of."""

    def __init__(self) -> None:
        self.about: dict[int, dict[int, Suspect]] = {}  # peer -> reporter -> its latest report

    def heard(self, report: Suspect) -> None:
        if not report.sig or report.is_self_report:
            return
        by = self.about.setdefault(report.peer, {})
        if report.round >= by.get(report.node, report).round:
            by[report.node] = report

    def certificate(self, node: int, members: list[int], round: int,
                    refuted: Callable[[Suspect], bool] = lambda _: False) -> list[Suspect] | None:
        """Signed suspicions about ``node`` from a quorum of ``members``, each within
        EVIDENCE_ROUNDS of ``round`` and not ``refuted``; None when they are too few (yet)."""
        fresh = [r for reporter, r in sorted(self.about.get(node, {}).items())
                 if reporter in members and round - EVIDENCE_ROUNDS <= r.round <= round + 1 and not refuted(r)]
        return fresh if keeps_quorum(members, {r.node for r in fresh}) else None

    def forget_before(self, round: int) -> None:
        for peer in list(self.about):
            kept = {n: r for n, r in self.about[peer].items() if r.round >= round - EVIDENCE_ROUNDS}
            if kept:
                self.about[peer] = kept
            else:
                del self.about[peer]


class Evidence:
    """One member's side of it: the job's keys (None: the fleet runs unsigned), the signed
    reports heard, when each node was last heard from, and the certificates of those we dropped."""

    def __init__(self, keys: MemberKeys | None) -> None:
        self.keys = keys
        self.signed = SignedReports()
        self.heard_at: dict[int, float] = {}  # node -> when we last heard anything from it
        self.carried: dict[int, list[dict[str, object]]] = {}  # node we dropped -> its certificate

    def carry(self, members: list[int]) -> list[dict[str, object]]:
        """The certificates a view of ``members`` carries: of every node we dropped that it
        still leaves out (judged at the receiver's own round: a member that hung when they
        were signed finds them fresh)."""
        for node in [n for n in self.carried if n in members]:
            del self.carried[node]  # back: its certificate is spent
        return [entry for node in sorted(self.carried) for entry in self.carried[node]]

    def heard_from(self, node: int, now: float) -> None:
        """Anything from ``node`` came (a frame, a status, a report): it is not silent to us."""
        self.heard_at[node] = now

    def quiet_for(self, node: int, now: float) -> float:
        """How long we have heard nothing at all from ``node`` (inf: never heard of it)."""
        return now - self.heard_at.get(node, -float("inf"))


def evidence_of(reports: Iterable[Suspect]) -> list[dict[str, object]]:
    """Signed suspicions as a view carries them."""
    return [{"node": r.node, "round": r.round, "peer": r.peer, "incarnation": r.incarnation, "sig": r.sig}
            for r in reports]
