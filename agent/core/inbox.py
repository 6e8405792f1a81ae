"""Bytes crossing into the agent core: a message's topic and payload, decoded and checked.

``read_message`` turns one message as the broker delivered it into a typed event, or counts
why it was refused (a bad frame, a forged report, JSON that does not parse). The same code
reads for the real transport and the in-memory fleet.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.events import BridgeSeen, ControlSeen, DigestSeen, StatusSeen, SuspectSeen, ViewSeen
from agent.core.report import Counters
from agent.protocol.chunking import DownlinkRate
from agent.protocol.keys import MemberKeys
from agent.protocol.membership import StatusSource, status_source
from agent.protocol.membership.evidence import Signature, signature
from agent.protocol.messages import (
    Control,
    MessageError,
    Signed,
    StateDigest,
    Status,
    Suspect,
    View,
)
from agent.protocol.topics import Topics
from agent.protocol.wire import NO_NODE, Flag, Frame, Kind, Rejection, RejectReason, decode


@dataclass(frozen=True)
class LinkFrame:
    """A frame decoded from a link topic, or (``fanned``) from a round root's fan-out topic."""

    frame: Frame
    fanned: bool


Read = LinkFrame | StatusSeen | BridgeSeen | ViewSeen | SuspectSeen | DigestSeen | ControlSeen


@dataclass
class Inbox:
    node: int
    job: int
    topics: Topics
    counters: Counters
    downlink: DownlinkRate
    keys: MemberKeys | None = None  # the job's ring: control messages are checked against it

    def read(self, topic: str, payload: bytes, arrival: float) -> Read | None:
        """``payload`` on ``topic`` as an event, None when refused (counted) or not ours."""
        link = self.topics.parse_link(topic)
        publisher = self.topics.parse_fanout(topic) if link is None else None
        if publisher is not None:
            if publisher == self.node:
                return None  # our own fan-out, back from the broker
            link = (publisher, self.node)  # its publisher is the sender, as on a link topic
        if link is not None:
            return self._frame(payload, link[0], arrival, fanned=publisher is not None)
        try:
            return self._json(topic, payload)
        except MessageError as exc:
            self.counters.rejected[f"json_{exc.reason}"] += 1
        return None

    def _frame(self, payload: bytes, sender: int, arrival: float, fanned: bool) -> LinkFrame | None:
        self.counters.bytes_received += len(payload)
        frame = decode(payload, expected_sender=sender, job=self.job)
        if isinstance(frame, Rejection):
            self.counters.rejected[frame.reason.value] += 1
            return None
        self.downlink.observe(len(payload), arrival)  # large ones only
        if fanned and not is_fanned_result(frame):
            # A fan-out reaches every member: only a result for all (the round machine
            # takes it from the round's root only), never a frame meant for one of them.
            self.counters.rejected["fanout_not_a_result"] += 1
            return None
        return LinkFrame(frame, fanned)

    def _refused(self, forged: bool, reason: RejectReason) -> bool:
        if forged:
            self.counters.rejected[reason] += 1
        return forged

    def _signed(self, kind: str, message: Signed, signer: int) -> bool:
        """With the job's keys, whether ``message`` carries ``signer``'s valid signature; a
        refusal is counted by kind and reason (``status_unsigned``, ``view_bad_signature``, ...)."""
        if self.keys is None:
            return True
        verdict = signature(self.keys, message, signer)
        if verdict is Signature.VALID:
            return True
        self.counters.rejected[f"{kind}_{verdict.value}"] += 1
        return False

    def _json(self, topic: str, payload: bytes) -> Read | None:
        topics = self.topics
        # The ACL lets a device write only its own topics: a message there in another's name
        # is a forgery. Retained, a forged status would speak for that node (say it offline
        # with a higher incarnation: it exits as displaced) to everyone who subscribes later.
        if (owner := topics.parse_status(topic)) is not None:
            status = Status.decode(payload)
            forged = status_source(status, owner) is StatusSource.FORGED
            if self._refused(forged, RejectReason.STATUS_FORGED) or not self._signed("status", status, owner):
                return None
            return StatusSeen(status)
        if (publisher := topics.parse_view(topic)) is not None:
            view = View.decode(payload)
            return ViewSeen(view, publisher) if self._signed("view", view, publisher) else None
        if (reporter := topics.parse_suspect(topic)) is not None:
            report = Suspect.decode(payload)  # also an absence claimed for another
            if self._refused(report.node != reporter, RejectReason.SUSPECT_FORGED) or not self._signed(
                    "suspect", report, reporter):
                return None
            return SuspectSeen(report)
        if (announcer := topics.parse_state(topic)) is not None:
            digest = StateDigest.decode(payload)
            forged = digest.node != announcer
            return None if self._refused(forged, RejectReason.STATE_DIGEST_FORGED) else DigestSeen(digest)
        if (site := topics.parse_bridge(topic)) is not None:
            return BridgeSeen(site, payload == b"1")
        if topic == topics.control:
            control = Control.decode(payload)
            return ControlSeen(control) if control.node == self.node else None
        return None

    def busy_sender(self, topic: str) -> int | None:
        """The sender of a large message still arriving on ``topic`` (None: not a frame's)."""
        link = self.topics.parse_link(topic)
        if link is None and (publisher := self.topics.parse_fanout(topic)) is not None:
            return publisher  # a result chunk of the fan-out, from its publisher
        return None if link is None else link[0]


def is_fanned_result(frame: Frame) -> bool:
    """What a root publishes on its fan-out topic: a result chunk addressed to nobody."""
    return (frame.kind == Kind.DATA and frame.target == NO_NODE
            and frame.flags & (Flag.BROADCAST | Flag.FINAL) == Flag.BROADCAST | Flag.FINAL)
