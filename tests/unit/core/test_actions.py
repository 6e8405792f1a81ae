"""What leaves an agent (agent/core/actions.py): each kind of message on its topic, retained
and reliable as decided once, for the agent and the in-memory fleet alike."""

from __future__ import annotations

import numpy as np

from agent.core.actions import Channel, Publish
from agent.protocol.messages import StateDigest, Status, Suspect, Telemetry, View
from agent.protocol.topics import Topics
from agent.protocol.wire import Frame, Kind, decode

TOPICS = Topics("job")


def test_every_kind_of_message_goes_to_its_topic_retained_and_reliable_as_the_table_says() -> None:
    frame = Frame(Kind.DATA, 0, 3, 2, 0, 1, contributors=frozenset({2})).with_values(np.ones(4, np.float32))
    status, view = Status(2, "online"), View(4, [0, 1, 2], 2, 2, 10)
    cases = [
        (Publish.frame_to(2, 5, frame), TOPICS.link(2, 5), False, False),
        (Publish.fanout(2, frame), TOPICS.fanout(2), False, False),
        (Publish.status_of(status), TOPICS.status(2), True, True),
        (Publish.view_by(2, view), TOPICS.view_of(2), True, True),
        (Publish.suspect(Suspect(2, 3, 4)), TOPICS.suspect(2), False, False),
        (Publish.telemetry(Telemetry(node=2, round=3, epoch=1, algorithm="ft-tree", wall_time=0.0)), TOPICS.telemetry(2), False, True),
        (Publish.state_digest(StateDigest(2, 3, "ab" * 16)), TOPICS.state(2), True, False),
    ]
    assert {p.channel for p, *_ in cases} == set(Channel)
    for publish, topic, retain, reliable in cases:
        assert (publish.topic(TOPICS), publish.retain, publish.reliable) == (topic, retain, reliable)


def test_the_payload_is_the_message_encoded_as_the_receivers_decode_it() -> None:
    frame = Frame(Kind.DATA, 0, 3, 2, 0, 1, contributors=frozenset({2})).with_values(np.arange(4, dtype=np.float32))
    assert decode(Publish.frame_to(2, 5, frame).payload(), expected_sender=2) == frame
    assert Status.decode(Publish.status_of(Status(2, "joining")).payload()) == Status(2, "joining")
