"""The two broadcast strategies behind one interface, each alone with the pieces it uses."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, Fanout, RoundContext, Send
from agent.protocol.ft_broadcast import (
    BroadcastStrategy,
    FanoutBroadcast,
    ResultBook,
    TreeBroadcast,
)
from agent.protocol.ft_courier import Courier, CourierEvent
from agent.protocol.ft_receipts import Receipts
from agent.protocol.ft_relay import Relay
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.ft_watch import PeerWatch
from agent.protocol.topology import Tree
from agent.protocol.wire import NO_NODE, Flag, Frame, Kind

TREE = Tree((0, 1, 2, 3, 4), 2)  # 0: children 1, 2; 1: children 3, 4
RTO = 0.1
CFG = AllreduceConfig(chunk_size=4, timeout_mode="fixed", fixed_timeout=RTO, broadcast="fanout")
ALL = frozenset(range(5))


class Rig:
    def __init__(self, node: int) -> None:
        ctx = RoundContext(CFG, TREE, node, 0, np.zeros(8, np.float32), 0, CFG.new_links(), 0.0)
        self.scope = scope = RoundScope(ctx)
        watch = PeerWatch(scope)
        relay = Relay(scope, watch)
        self.events: list[CourierEvent] = []
        self.courier = Courier(scope, watch, relay, self.events.append)
        self.results = ResultBook(scope, self.courier)
        self.receipts = Receipts(scope, relay)
        self.fanout = FanoutBroadcast(scope, self.results, self.courier, self.receipts)
        self.tree = TreeBroadcast(self.results)

    def set(self, j: int, now: float, strategy: BroadcastStrategy) -> Frame:
        """What the round machine does with a chunk of the result (see ResultFlow)."""
        ch = self.results[j]
        frame = self.scope.frame(Kind.DATA, j, Flag.BROADCAST | Flag.FINAL, ALL).with_values(np.ones(4, np.float32))
        ch.final, ch.final_ids, ch.final_frame = frame.values(), ALL, frame
        for peer in strategy.peers():
            self.results.send_down(j, peer, now)
        strategy.published(j, frame, now)
        return frame


def fanned(j: int, sender: int = 0) -> Frame:
    frame = Frame(Kind.DATA, 0, 0, sender, j, 2, Flag.BROADCAST | Flag.FINAL, origin=sender,
                  target=NO_NODE, contributors=ALL)
    return frame.with_values(np.ones(4, np.float32))


def test_the_tree_strategy_sends_each_chunk_to_the_children_and_the_adopted_acked() -> None:
    rig = Rig(1)
    rig.results.learn_route(2, 0, Hop.RELAY)  # 2's data came by a relay through 0
    rig.scope.down.add(4)
    assert rig.tree.peers() == [2, 3]
    rig.set(0, 0.0, rig.tree)
    sends = [a for a in rig.scope.out.flush() if isinstance(a, Send)]
    assert [(s.dst, s.frame.kind, s.frame.target) for s in sends] == [(0, Kind.RELAY, 2), (3, Kind.DATA, 3)]
    assert set(rig.courier.pending) == {(True, 0, 2), (True, 0, 3)}
    assert not rig.tree.fanned(fanned(0))


def test_the_fanout_root_publishes_each_chunk_once_and_sends_nobody_a_copy() -> None:
    rig = Rig(0)
    assert rig.fanout.peers() == []
    frame = rig.set(0, 0.0, rig.fanout)
    assert rig.scope.out.flush() == [Fanout(frame)] and rig.courier.pending == {}
    assert rig.fanout.fanned(fanned(0))
    # On a link topic a result names its target: not the fan-out.
    assert not rig.fanout.fanned(Frame(Kind.DATA, 0, 0, 0, 0, 2, Flag.BROADCAST, target=1))


def test_a_member_takes_the_fanout_from_the_root_only_and_pulls_a_chunk_it_missed() -> None:
    rig = Rig(3)
    assert not rig.fanout.take(fanned(1, sender=1), 0.01, acking=True)
    assert rig.scope.stats.dropped == 1
    assert rig.fanout.take(fanned(1), 0.01, acking=True)  # chunk 0 never came: it was lost
    sends = [a for a in rig.scope.out.flush() if isinstance(a, Send)]
    ack, pull = sends
    assert (ack.dst, ack.frame.kind, ack.frame.chunk_index) == (1, Kind.ACK, 1)  # the last chunk: at once
    assert (pull.dst, pull.frame.kind, pull.frame.indices()) == (1, Kind.PULL, [0])


def test_a_child_that_acks_none_of_the_fanout_is_probed_and_gets_the_result_once_it_answers() -> None:
    rig = Rig(1)
    for j in range(2):
        rig.fanout.take(fanned(j), 0.01 * j, acking=True)
        rig.set(j, 0.01 * j, rig.fanout)
    rig.scope.out.flush()
    ack = Frame(Kind.ACK, 0, 0, 3, 1, 2, Flag.BROADCAST, origin=3, target=1, contributors=ALL)
    rig.fanout.child_acked(ack.with_indices([0, 1]), [0, 1], 0.02)
    assert rig.scope.links.measured_rtt(3) == pytest.approx(0.01)  # from when we had chunk 1
    rig.fanout.completed(0.02)
    [due] = rig.fanout.timers()  # only child 4: child 3 ACKed all of it
    assert due == pytest.approx(0.02 + RTO)
    rig.fanout.on_timer(due)
    sends = [a for a in rig.scope.out.flush() if isinstance(a, Send)]
    assert [(s.dst, s.frame.kind) for s in sends] == [(4, Kind.PROBE)]  # a few bytes, not the result
    reply = Frame(Kind.PROBE, 0, 0, 4, 0, 2, Flag.REPLY, origin=4, target=1)
    rig.courier.watch.heard(reply, due + 0.01, shows_link=True)
    rig.fanout.on_timer(due + 0.01 + rig.scope.transmit(4, 8 * 4) + RTO)  # it lives: the result
    sends = [a for a in rig.scope.out.flush() if isinstance(a, Send)]
    assert sorted((s.dst, s.frame.chunk_index) for s in sends if s.frame.kind == Kind.DATA) == [(4, 0), (4, 1)]


def test_a_probed_peer_the_fleet_finds_down_meanwhile_leaves_no_timer_behind() -> None:
    rig = Rig(1)
    for j in range(2):
        rig.fanout.take(fanned(j), 0.01 * j, acking=True)
        rig.set(j, 0.01 * j, rig.fanout)
    rig.fanout.completed(0.02)
    rig.fanout.on_timer(0.02 + RTO)  # children 3 and 4 ACKed nothing: both probed
    assert sorted(rig.fanout.probed) == [3, 4]
    rig.scope.down.update({3, 4})  # their Wills came
    rig.fanout.on_timer(0.03 + RTO)
    assert rig.fanout.timers() == []
