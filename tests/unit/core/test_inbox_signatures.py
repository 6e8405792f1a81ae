"""The inbox checks control messages against the job's ring and counts refusals by kind and
reason (agent/core/inbox.py, issue 54)."""

from __future__ import annotations

from dataclasses import replace

from agent.core.events import StatusSeen, SuspectSeen, ViewSeen
from agent.core.inbox import Inbox
from agent.core.report import Counters
from agent.protocol.chunking import DownlinkRate
from agent.protocol.keys import MemberKeys, new_private_key, public_of
from agent.protocol.membership.evidence import seal
from agent.protocol.messages import Status, Suspect, View
from agent.protocol.topics import Topics

PRIVATE = {i: new_private_key() for i in range(3)}
RING = {i: public_of(k) for i, k in PRIVATE.items() if i < 2}  # node 2 is no member of the job
KEYS = {i: MemberKeys.of_private(i, k, RING) for i, k in PRIVATE.items()}
TOPICS = Topics("job")
FINGERPRINT = "0123456789abcdef"  # a view must name a model (agent/protocol/messages.py)


def inbox() -> Inbox:
    return Inbox(0, 7, TOPICS, Counters(), DownlinkRate(), KEYS[0])


def test_signed_control_messages_are_read_and_the_others_refused_by_kind_and_reason() -> None:
    box = inbox()
    status = seal(KEYS[1], Status(1, "online", round=4))
    assert box.read(TOPICS.status(1), status.encode(), 0.0) == StatusSeen(status)
    report = seal(KEYS[1], Suspect(1, 4, 0))
    assert box.read(TOPICS.suspect(1), report.encode(), 0.0) == SuspectSeen(report)
    view = seal(KEYS[1], View(2, [0, 1], 2, 1, 5, fingerprint=FINGERPRINT))
    assert box.read(TOPICS.view_of(1), view.encode(), 0.0) == ViewSeen(view, 1)
    assert box.read(TOPICS.status(1), Status(1, "online").encode(), 0.0) is None
    assert box.read(TOPICS.status(1), replace(status, round=5).encode(), 0.0) is None  # altered
    assert box.read(TOPICS.view_of(1), seal(KEYS[0], View(2, [0, 1], 2, 1, 5, fingerprint=FINGERPRINT)).encode(), 0.0) is None
    assert box.read(TOPICS.suspect(2), seal(KEYS[2], Suspect(2, 4, 0)).encode(), 0.0) is None
    assert dict(box.counters.rejected) == {"status_unsigned": 1, "status_bad_signature": 1,
                                           "view_bad_signature": 1, "suspect_unknown_key": 1}


def test_without_keys_nothing_is_checked() -> None:
    box = Inbox(0, 7, TOPICS, Counters(), DownlinkRate())
    assert box.read(TOPICS.status(1), Status(1, "online").encode(), 0.0) == StatusSeen(Status(1, "online"))
