"""ACKs and NACKs of what a node receives, alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.ft_receipts import ACK_AT_ONCE_BYTES, ACK_DELAY, Receipts
from agent.protocol.ft_relay import Relay
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.ft_watch import PeerWatch
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

CFG = AllreduceConfig(chunk_size=2, timeout_mode="fixed", fixed_timeout=0.1)
TREE = Tree((0, 1, 2), 2)


def receipts(chunks: int = 4) -> Receipts:
    ctx = RoundContext(CFG, TREE, 0, 0, np.zeros(2 * chunks, np.float32), 0, CFG.new_links(), 0.0)
    scope = RoundScope(ctx)
    return Receipts(scope, Relay(scope, PeerWatch(scope)))


def unit(sender: int, j: int, values: int = 2) -> Frame:
    frame = Frame(Kind.DATA, 0, 0, sender, j, 4, contributors=frozenset({sender}), origin=sender)
    return frame.with_values(np.ones(values, np.float32))


def acks(r: Receipts) -> list[Send]:
    return [a for a in r.scope.out.flush() if isinstance(a, Send) and a.frame.kind == Kind.ACK]


def test_direct_units_wait_for_company_and_go_in_one_ack() -> None:
    r = receipts()
    r.ack(unit(1, 0), Hop.DIRECT, 0.0, batch=True)
    r.ack(unit(1, 1), Hop.DIRECT, 0.001, batch=True)
    assert acks(r) == [] and r.timers() == [pytest.approx(min(ACK_DELAY, CFG.fixed_timeout / 4))]
    r.on_timer(r.timers()[0])
    [ack] = acks(r)
    assert ack.dst == 1 and ack.frame.indices() == [0, 1] and r.timers() == []


def test_the_last_chunk_or_a_large_unit_is_acked_at_once() -> None:
    r = receipts()
    r.ack(unit(1, 3), Hop.DIRECT, 0.0, batch=True)
    assert [a.frame.chunk_index for a in acks(r)] == [3]
    r.ack(unit(2, 0, values=ACK_AT_ONCE_BYTES // 4), Hop.DIRECT, 0.0, batch=True)
    assert [a.dst for a in acks(r)] == [2]


def test_relayed_units_are_acked_alone_back_the_way_they_came_and_floods_by_flood() -> None:
    r = receipts()
    relayed = unit(1, 0)

    r.ack(replace(relayed, sender=2), Hop.RELAY, 0.0, batch=True)
    [ack] = acks(r)
    assert (ack.dst, ack.frame.target, ack.frame.origin) == (2, 1, 0)
    r.ack(replace(relayed, sender=2), Hop.FLOOD, 0.0, batch=True)
    flooded = acks(r)
    assert flooded and all(a.frame.flags & Flag.FLOOD for a in flooded)


def test_a_gap_is_asked_for_once() -> None:
    r = receipts()
    r.nack_gaps(unit(1, 3), have=lambda i: i == 1)
    [nack] = [a for a in r.scope.out.flush() if isinstance(a, Send)]
    assert nack.dst == 1 and nack.frame.kind == Kind.NACK and nack.frame.indices() == [0, 2]
    r.nack_gaps(unit(1, 3), have=lambda i: i == 1)
    assert r.scope.out.flush() == [] and r.scope.stats.nacks == 1 and r.scope.book.states[1] == "suspected"
