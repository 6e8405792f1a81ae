"""ft-tree with ``broadcast: fanout``: the root publishes each result chunk once, every member
takes it from the root only, relays nothing, and pulls what the fan-out lost from its parent."""

from __future__ import annotations

import numpy as np

from agent.core import AgentCore, CoreConfig
from agent.core.events import MessageArrived
from agent.protocol.allreduce import AllreduceConfig, Fanout, Note, RoundContext, Send
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topics import Topics
from agent.protocol.topology import Tree
from agent.protocol.wire import NO_NODE, DType, Flag, Frame, Kind, encode

CFG = AllreduceConfig(chunk_size=4, min_timeout=0.05, initial_timeout=0.5, round_deadline=5.0,
                      broadcast="fanout")
TREE = Tree((0, 1, 2, 3, 4, 5, 6), 2)  # 0 root; 1 inner with leaves 3 and 4


def machine(node: int, grad: float = 1.0) -> FtTreeRound:
    m = FtTreeRound(RoundContext(CFG, TREE, node, 0, np.full(8, grad, np.float32), 0, CFG.new_links(), 0.0))
    m.start(0.0)
    return m


def final(j: int, sender: int = 0, value: float = 2.0, target: int = NO_NODE) -> Frame:
    frame = Frame(Kind.DATA, CFG.job, 0, sender, j, 2, Flag.BROADCAST | Flag.FINAL, target=target,
                  contributors=frozenset(range(7)))
    return frame.with_values(np.full(4, value, np.float32), CFG.wire_dtype)


def sends(actions: list[object], kind: Kind) -> list[Send]:
    return [a for a in actions if isinstance(a, Send) and a.frame.kind == kind]


def test_the_root_publishes_each_chunk_once_and_sends_no_broadcast_on_links() -> None:
    root = machine(0)
    out = []
    for child, j in ((1, 0), (1, 1), (2, 0), (2, 1)):
        subtree = frozenset(TREE.subtree(child))
        unit = Frame(Kind.DATA, CFG.job, 0, child, j, 2, Flag.NONE, target=0, contributors=subtree)
        out += root.on_frame(unit.with_values(np.ones(4, np.float32), CFG.wire_dtype), 0.01)
    fanned = [a.frame for a in out if isinstance(a, Fanout)]
    assert [(f.chunk_index, f.target, f.flags & Flag.FINAL) for f in fanned] == [(0, NO_NODE, Flag.FINAL),
                                                                                  (1, NO_NODE, Flag.FINAL)]
    assert not [s for s in sends(out, Kind.DATA) if s.frame.is_broadcast]
    assert root.result is not None and not root.result.degraded


def test_an_inner_node_takes_the_roots_fanout_relays_nothing_and_acks_it_to_its_parent_once() -> None:
    inner = machine(1)
    out = inner.on_frame(final(0), 0.02) + inner.on_frame(final(1), 0.02)
    assert not sends(out, Kind.DATA)
    assert not [a for a in out if isinstance(a, Fanout)]
    assert [(a.dst, a.frame.indices()) for a in sends(out, Kind.ACK)] == [(0, [0, 1])]
    assert inner.result is not None
    assert inner.result.values.tolist() == [2.0] * 8


def test_a_leaf_acks_the_fanout_to_its_parent_which_measures_its_link_from_it() -> None:
    leaf, inner = machine(3), machine(1)
    inner.on_frame(final(0), 0.020)
    inner.on_frame(final(1), 0.021)
    acks = sends(leaf.on_frame(final(0), 0.022) + leaf.on_frame(final(1), 0.023), Kind.ACK)
    assert [a.dst for a in acks] == [1]  # not the root: it sent the fan-out, but waits for nobody
    assert not inner.scope.links.is_measured(3)
    inner.on_frame(acks[0].frame, 0.030)
    assert inner.scope.links.is_measured(3)
    assert inner.scope.links.peers[3].srtt is not None and abs(inner.scope.links.peers[3].srtt - 0.009) < 1e-9


def test_a_fanout_from_anyone_but_the_rounds_root_is_dropped() -> None:
    leaf = machine(3)
    for forger in (1, 4, 6):  # the parent, a sibling, a stranger: each may write only its own
        leaf.on_frame(final(0, sender=forger, value=1e3), 0.02)
        leaf.on_frame(final(1, sender=forger, value=1e3), 0.02)
    assert leaf.result is None and leaf.stats.dropped == 6
    assert all(ch.final is None for ch in leaf.chunks)


def test_implausible_values_on_the_fanout_are_refused() -> None:
    leaf = machine(3)
    leaf.on_frame(final(0, value=1e6), 0.02)
    assert leaf.chunks[0].final is None and leaf.stats.implausible == 1


def test_a_chunk_lost_in_the_fanout_is_pulled_from_the_parent_at_once_and_once() -> None:
    leaf = machine(3)
    out = leaf.on_frame(final(1), 0.02)  # chunk 0 did not come: frames of one topic keep order
    pulls = sends(out, Kind.PULL)
    assert [(p.dst, p.frame.indices()) for p in pulls] == [(1, [0])]
    assert not sends(leaf.on_frame(final(1), 0.03), Kind.PULL)  # a duplicate asks nothing more
    # The parent's answer (target: us, a direct frame) completes the round.
    leaf.on_frame(final(0, sender=1, target=3), 0.04)
    assert leaf.result is not None and not leaf.result.degraded


def test_a_parent_answers_a_pull_for_a_chunk_it_has_not_got_yet_when_the_fanout_brings_it() -> None:
    inner = machine(1)
    pull = Frame(Kind.PULL, CFG.job, 0, 3, 0, 2, Flag.BROADCAST).with_indices([0])
    assert not sends(inner.on_frame(pull, 0.02), Kind.DATA)
    answer = sends(inner.on_frame(final(0), 0.03), Kind.DATA)
    assert [(s.dst, s.frame.chunk_index, s.frame.target) for s in answer] == [(3, 0, 3)]


def test_the_core_reads_the_fanout_of_others_only_when_its_rounds_may_use_it() -> None:
    # In fanout mode, or in tree mode while a view may switch the fleet to it (adapt_broadcast:
    # a fleet on slow links); in tree rounds a fan-out is refused (test_core).
    topics = Topics("j")
    for mode, adapt, reads in (("tree", False, False), ("tree", True, True), ("fanout", False, True)):
        config = CoreConfig(node=3, job="j", allreduce=AllreduceConfig(broadcast=mode),  # type: ignore[arg-type]
                            adapt_broadcast=adapt)
        core = AgentCore(config, incarnation=1, now=0.0)
        assert (topics.all_fanout() in core.subscriptions()) == reads
    # Its own fan-out coming back from the broker is not even decoded.
    own = encode(final(0, sender=3))
    assert core.handle(MessageArrived(topics.fanout(3), own), 0.0) == []
    assert core.parts.counters.bytes_received == 0
    # Another's is a frame like one on a link topic, its sender checked against the topic.
    core.handle(MessageArrived(topics.fanout(0), encode(final(0, sender=2))), 0.0)
    assert dict(core.parts.counters.rejected) == {"forged_sender": 1}


def test_the_root_applies_exactly_what_it_publishes() -> None:
    cfg = AllreduceConfig(chunk_size=8, wire_dtype=DType.F16, broadcast="fanout")
    root = FtTreeRound(RoundContext(cfg, Tree((0, 1), 2), 0, 0, np.full(8, 0.1, np.float32), 0,
                                    cfg.new_links(), 0.0))
    root.start(0.0)
    up = Frame(Kind.DATA, 0, 0, 1, 0, 1, contributors=frozenset({1})).with_values(
        np.full(8, 0.2, np.float32), DType.F16)
    fanned = [a.frame for a in root.on_frame(up, 0.01) if isinstance(a, Fanout)]
    assert root.result is not None and len(fanned) == 1 and fanned[0].dtype == DType.F16
    assert root.result.values.tobytes() == fanned[0].values().tobytes()


def test_the_core_refuses_on_a_fanout_topic_anything_but_a_result_for_all() -> None:
    """A member may publish on its own fan-out topic: a frame there addressed to one member (a
    final with a target, a unit, a pull) would reach every member at once, so it is refused."""
    core = AgentCore(CoreConfig(node=3, allreduce=CFG), incarnation=1, now=0.0)
    topics = Topics("default")
    unit = Frame(Kind.DATA, CFG.job, 0, 4, 0, 2, Flag.NONE, target=3, contributors=frozenset({4}))
    pull = Frame(Kind.PULL, CFG.job, 0, 4, 0, 2, Flag.BROADCAST)
    for frame in (final(0, sender=4, target=3), unit.with_values(np.ones(4, np.float32)), pull):
        assert core.handle(MessageArrived(topics.fanout(4), encode(frame)), 0.0) == []
    assert dict(core.parts.counters.rejected) == {"fanout_not_a_result": 3}


def test_a_root_back_from_a_dropped_connection_publishes_its_fanout_again() -> None:
    cfg = AllreduceConfig(chunk_size=8, broadcast="fanout")
    root = FtTreeRound(RoundContext(cfg, Tree((0, 1), 2), 0, 0, np.full(8, 0.1, np.float32), 0,
                                    cfg.new_links(), 0.0))
    root.start(0.0)
    up = Frame(Kind.DATA, 0, 0, 1, 0, 1, contributors=frozenset({1})).with_values(np.full(8, 0.3, np.float32))
    first = [a.frame for a in root.on_frame(up, 0.01) if isinstance(a, Fanout)]
    again = [a.frame for a in root.reconnected(0.05, away=0.02) if isinstance(a, Fanout)]
    assert again == first


def test_a_fanout_that_counts_our_unit_before_its_ack_came_marks_that_link() -> None:
    """0 -> 1 cut one way: 1's data reaches the root, the root's ACKs do not, its fan-out does.
    In tree mode the rerouted broadcast marks the link; here the fan-out that counts our unit
    while its ACK (sent at once for the last chunk) is missing does."""
    inner = machine(1)
    for j in (0, 1):  # the children's data: 1 sends its subtree's units up to the root
        for leaf in (3, 4):
            unit = Frame(Kind.DATA, CFG.job, 0, leaf, j, 2, Flag.NONE, target=1, contributors=frozenset({leaf}))
            inner.on_frame(unit.with_values(np.ones(4, np.float32), CFG.wire_dtype), 0.01)
    assert {p.chunk for p in inner.courier.pending.values() if not p.broadcast} == {0, 1}
    inner.on_frame(final(0), 0.03)
    assert inner.scope.book.states[0] == "ok"  # chunk 0's ACK may be batched: no verdict
    inner.on_frame(final(1), 0.03)
    assert inner.result is not None and inner.result.link_states[0] == "rerouted"


def test_a_unit_the_fanout_counts_is_delivered_even_when_its_ack_was_lost() -> None:
    """Our parent's ACKs are all it sends us in a fan-out round: with them lost, a unit whose
    chunk the root's result already counts went to the backup a timeout later (p = 0.1 on
    every link: 51 reroutes against 114 resends, tree mode 38 against 326)."""
    leaf = machine(3)  # its units of chunks 0 and 1 went to its parent 1; every ACK is lost
    assert {(p.chunk, p.route.target) for p in leaf.courier.pending.values()} == {(0, 1), (1, 1)}
    leaf.on_frame(final(0), 0.02)  # the root's result of chunk 0 counts our unit
    assert {p.chunk for p in leaf.courier.pending.values()} == {1}  # chunk 1's still waits for its ACK
    later: list[Send] = []
    for now in (0.3, 0.6, 1.0, 1.5, 2.0):
        later += sends(leaf.on_timer(now), Kind.DATA)
    assert later, "the unit of chunk 1 goes on (resent or rerouted): nothing counts it yet"
    assert not [s for s in later if s.frame.chunk_index == 0]


def fanout_ack(child: int, parent: int, chunks: list[int]) -> Frame:
    ack = Frame(Kind.ACK, CFG.job, 0, child, max(chunks), 2, Flag.BROADCAST, target=parent,
                contributors=frozenset(range(7)))
    return ack.with_indices(chunks)


def test_a_child_that_acks_none_of_the_fanout_is_probed_and_found_silent_in_the_round() -> None:
    """A child frozen or cut off in the round ACKs none of the fan-out: its parent asks it for
    a word (a PROBE, not the 1.6 MB result: a copy's timers count its transmission at the
    floor rate, 0.8 s twice) and reports it silent in this round. Without that a frozen leaf
    was found only by the next round's wait for its contribution (0.64 s, the agents'
    defaults, 7 agents)."""
    inner = machine(1)
    for j in range(2):
        inner.on_frame(final(j), 0.02)
    assert inner.result is not None
    inner.on_frame(fanout_ack(3, 1, [0, 1]), 0.025)  # leaf 3 ACKs the fan-out; leaf 4 is frozen
    out: list[object] = []
    for now in (0.1, 0.3, 0.6, 1.0, 1.5, 2.0):  # its RTO: the initial 0.5 s (never measured)
        out += inner.on_timer(now)
    assert [s.dst for s in sends(out, Kind.PROBE)] == [4]
    assert not [s for s in sends(out, Kind.DATA) if s.frame.is_broadcast]
    silent = [a for a in out if isinstance(a, Note) and a.kind == "silent"]
    assert [n.peer for n in silent] == [4], silent


def test_a_child_that_answers_the_probe_but_acked_nothing_gets_the_result() -> None:
    """It lives, so the fan-out was lost to it (or still arrives on a slow downlink: then it
    gets the copy only once the result's transmission time has passed)."""
    inner = machine(1)
    for j in range(2):
        inner.on_frame(final(j), 0.02)
    inner.on_frame(fanout_ack(3, 1, [0, 1]), 0.025)
    out = inner.on_timer(0.1) + inner.on_timer(0.6)
    assert [s.dst for s in sends(out, Kind.PROBE)] == [4]
    reply = Frame(Kind.PROBE, CFG.job, 0, 4, 0, 2, Flag.REPLY, target=1)
    out = inner.on_frame(reply, 0.61)
    for now in (0.7, 1.0, 1.5, 2.0):
        out += inner.on_timer(now)
    copies = [s for s in sends(out, Kind.DATA) if s.frame.is_broadcast]
    assert copies and {s.frame.target for s in copies} == {4}


def test_a_root_probes_the_nodes_under_a_child_that_acks_nothing() -> None:
    """Leaves 3 and 4 ACK the fan-out to their parent 1: cut off together with it (after
    their data was counted), nobody else would find them silent in this round."""
    root = machine(0)
    for child, j in ((1, 0), (1, 1), (2, 0), (2, 1)):
        unit = Frame(Kind.DATA, CFG.job, 0, child, j, 2, Flag.NONE, target=0,
                     contributors=frozenset(TREE.subtree(child)))
        root.on_frame(unit.with_values(np.ones(4, np.float32), CFG.wire_dtype), 0.01)
    assert root.result is not None
    root.on_frame(fanout_ack(2, 0, [0, 1]), 0.015)
    out: list[object] = []
    for now in (0.1, 0.3, 0.6, 1.0, 1.5, 2.0):
        out += root.on_timer(now)
        if sends(out, Kind.PROBE):
            out += root.on_frame(Frame(Kind.PROBE, CFG.job, 0, 3, 0, 2, Flag.REPLY, target=0), now + 0.01)
    assert sorted(s.dst for s in sends(out, Kind.PROBE)) == [1, 3, 4]
    assert sorted(a.peer for a in out if isinstance(a, Note) and a.kind == "silent") == [1, 4]


def test_a_child_that_acked_part_of_the_fanout_is_left_to_pull_the_rest() -> None:
    inner = machine(1)
    for j in range(2):
        inner.on_frame(final(j), 0.02)
    inner.on_frame(fanout_ack(3, 1, [0]), 0.025)
    inner.on_frame(fanout_ack(4, 1, [0, 1]), 0.025)
    out: list[object] = []
    for now in (0.1, 0.3, 0.6, 1.0):
        out += inner.on_timer(now)
    assert not [s for s in sends(out, Kind.DATA) if s.frame.is_broadcast]
