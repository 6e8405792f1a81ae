"""The courier alone: units sent, ACKed, resent, rerouted and given up, with its events."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, Note, RoundContext, Send
from agent.protocol.ft_courier import (
    Courier,
    CourierEvent,
    Delivered,
    PeerSilent,
    Pending,
    Route,
    Undeliverable,
)
from agent.protocol.ft_relay import Relay
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.ft_watch import PeerWatch
from agent.protocol.notes import NoteKind
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

TREE = Tree((0, 1, 2, 3, 4, 5, 6), 2)  # leaf 3: parent 1, backup 4, grandparent 0
RTO = 0.1
CFG = AllreduceConfig(chunk_size=4, timeout_mode="fixed", fixed_timeout=RTO, round_deadline=5.0)


class Rig:
    """A courier on ``node`` with the pieces it reads, and the events it emitted."""

    def __init__(self, node: int = 3, cfg: AllreduceConfig = CFG) -> None:
        ctx = RoundContext(cfg, TREE, node, 0, np.zeros(8, np.float32), 0, cfg.new_links(), 0.0)
        self.scope = RoundScope(ctx)
        self.watch = PeerWatch(self.scope)
        self.events: list[CourierEvent] = []
        self.courier = Courier(self.scope, self.watch, Relay(self.scope, self.watch), self.events.append)

    def unit(self, j: int, routes: list[Route], broadcast: bool = False, peer: int = 1) -> Pending:
        ids = frozenset({self.scope.node})
        frame = self.scope.frame(Kind.DATA, j, Flag.BROADCAST if broadcast else Flag.NONE, ids)
        frame = frame.with_values(np.ones(4, np.float32))
        return Pending(broadcast, j, peer, ids, frame, routes, cycle=not broadcast)

    def sends(self) -> list[Send]:
        return [a for a in self.scope.out.flush() if isinstance(a, Send)]

    def ack(self, sender: int, *chunks: int, now: float) -> None:
        frame = Frame(Kind.ACK, 0, 0, sender, max(chunks), 2, origin=sender, target=self.scope.node,
                      contributors=frozenset({self.scope.node}))
        self.courier.on_ack(frame.with_indices(list(chunks)) if len(chunks) > 1 else frame, now)


UP = [Route(Hop.DIRECT, 1, 1), Route(Hop.RELAY, 4, 1), Route(Hop.DIRECT, 0, 0), Route(Hop.FLOOD, -1, 1)]


def test_a_unit_goes_on_its_first_route_and_an_ack_delivers_it() -> None:
    rig = Rig()
    rig.courier.send(rig.unit(0, UP), 0.0)
    [send] = rig.sends()
    assert (send.dst, send.frame.kind, send.frame.target) == (1, Kind.DATA, 1)
    assert rig.courier.next_due() == pytest.approx(RTO)  # a silent parent: one RTO, no resend
    rig.ack(1, 0, now=0.03)
    assert rig.courier.pending == {}
    assert [type(e) for e in rig.events] == [Delivered]
    assert rig.scope.links.measured_rtt(1) == pytest.approx(0.03)
    assert rig.courier.next_due() is None


def test_an_ack_of_a_later_unit_resends_the_earlier_one_on_the_same_link() -> None:
    rig = Rig()
    rig.courier.send(rig.unit(0, UP), 0.0)
    rig.courier.send(rig.unit(1, UP), 0.001)
    rig.sends()
    rig.ack(1, 1, now=0.02)  # chunk 0's frame (or its ACK) was lost: frames on a link keep order
    [again] = rig.sends()
    assert (again.dst, again.frame.chunk_index) == (1, 0)
    assert rig.scope.stats.retransmits == 1 and rig.scope.stats.reroutes == 0


def test_a_peer_that_shows_life_gets_a_resend_not_a_verdict() -> None:
    rig = Rig()
    rig.courier.send(rig.unit(0, UP), 0.0)
    rig.sends()
    rig.watch.heard(Frame(Kind.PROBE, 0, 0, 1, 0, 2, Flag.PROGRESS), 0.01, shows_link=True)
    due = rig.courier.next_due()
    assert due == pytest.approx(0.01 + RTO / 2)  # half an RTO after it last spoke
    rig.courier.expire(due)  # type: ignore[arg-type]
    assert [(s.dst, s.frame.chunk_index) for s in rig.sends()] == [(1, 0)]
    assert rig.scope.stats.retransmits == 1 and 1 not in rig.scope.dead and rig.events == []


def test_a_silent_peer_kills_the_link_and_the_unit_goes_by_the_backup() -> None:
    rig = Rig()
    rig.courier.send(rig.unit(0, UP), 0.0)
    rig.sends()
    rig.courier.expire(RTO)
    actions = rig.scope.out.flush()
    notes = [a.kind for a in actions if isinstance(a, Note)]
    assert notes == [NoteKind.TIMEOUT, NoteKind.LINK_DEAD, NoteKind.REROUTE]
    [relay] = [a for a in actions if isinstance(a, Send)]
    assert (relay.dst, relay.frame.kind, relay.frame.target) == (4, Kind.RELAY, 1)
    assert rig.events == [PeerSilent(1, "link dead, nothing heard", RTO)]
    assert 1 in rig.scope.dead and rig.scope.book.states[1] == "failed"


def test_a_unit_whose_routes_all_fail_is_undeliverable() -> None:
    rig = Rig(node=1)
    unit = rig.unit(0, [Route(Hop.DIRECT, 3, 3)], broadcast=True, peer=3)
    rig.courier.send(unit, 0.0)
    rig.courier.expire(RTO)
    assert rig.courier.pending == {}
    assert [type(e) for e in rig.events] == [PeerSilent, Undeliverable]
    assert isinstance(rig.events[1], Undeliverable) and rig.events[1].unit is unit


def test_a_flood_to_a_peer_reported_silent_waits_until_it_speaks() -> None:
    rig = Rig()
    rig.watch.report_silent(1, "nothing from it", 0.0)
    rig.courier.send(rig.unit(0, [Route(Hop.DIRECT, 1, 1), Route(Hop.FLOOD, -1, 1)]), 0.0)
    rig.sends()
    rig.courier.expire(RTO)  # the link dies; a flood would cost every member a copy
    assert rig.sends() == [] and rig.courier.held_for == {1}
    assert rig.courier.next_due() == float("inf")
    rig.courier.release_held(1, 0.15)  # it refuted the report: alive, its links cut
    [flooded] = rig.sends()
    assert flooded.dst == 4 and flooded.frame.flags & Flag.FLOOD and flooded.frame.target == 1


def test_a_peer_going_down_drops_what_was_for_it_and_gives_up_what_cannot_reach_it() -> None:
    rig = Rig(node=1)
    rig.courier.send(rig.unit(0, [Route(Hop.DIRECT, 3, 3), Route(Hop.FLOOD, -1, 3)], broadcast=True, peer=3), 0.0)
    rig.courier.send(rig.unit(0, [Route(Hop.DIRECT, 0, 0), Route(Hop.RELAY, 2, 0)], peer=0), 0.0)
    rig.sends()
    rig.scope.down.add(0)
    rig.courier.peer_down(0, 0.01)  # both routes of the reduce unit end at 0
    assert set(rig.courier.pending) == {(True, 0, 3)}
    assert [type(e) for e in rig.events] == [Undeliverable] and 0 in rig.scope.dead
    rig.scope.down.add(3)
    rig.courier.peer_down(3, 0.02)  # the result is not for anybody any more: dropped, not given up
    assert rig.courier.pending == {} and len(rig.events) == 1


def test_the_timers_of_a_unit_cover_the_bytes_queued_ahead_of_it() -> None:
    slow = AllreduceConfig(chunk_size=4, min_timeout=0.05, initial_timeout=0.05, link_rate_floor=1000.0)
    rig = Rig(cfg=slow)
    first, second = rig.unit(0, UP), rig.unit(1, UP)
    rig.courier.send(first, 0.0)
    rig.courier.send(second, 0.0)
    assert rig.courier.drain(second) == pytest.approx(2 * rig.courier.drain(first))
    rig.ack(1, 0, now=0.01)
    assert rig.courier.drain(second) == pytest.approx(rig.scope.links.transmit_time(1, second.size))
