"""Batched ACKs of the FT-tree: one ACK frame per batch of direct units, gaps still mean loss."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.ft_receipts import ACK_DELAY, ACK_EVERY
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import DType, Flag, Frame, Kind, decode, encode

CFG = AllreduceConfig(chunk_size=2, timeout_mode="fixed", fixed_timeout=0.1, round_deadline=2.0)
TREE = Tree((0, 1, 2), 2)
CHUNKS = 5


def machine(node: int, values: float = 0.0, cfg: AllreduceConfig = CFG, chunks: int = CHUNKS) -> FtTreeRound:
    grad = np.full(2 * chunks, values, np.float32)
    return FtTreeRound(RoundContext(cfg, TREE, node, 3, grad, 0, cfg.new_links(), 0.0))


def unit(sender: int, j: int, value: float = 1.0, chunks: int = CHUNKS) -> Frame:
    frame = Frame(Kind.DATA, 0, 3, sender, j, chunks, Flag.NONE, contributors=frozenset({sender}))
    return frame.with_values(np.full(2, value, np.float32))


def sends(actions: list, kind: Kind) -> list[Frame]:  # type: ignore[type-arg]
    return [a.frame for a in actions if isinstance(a, Send) and a.frame.kind == kind]


def acked(frame: Frame) -> list[int]:
    return frame.indices() if frame.payload else [frame.chunk_index]


def test_direct_units_are_acked_in_one_frame_at_the_last_chunk() -> None:
    root = machine(0)
    root.start(0.0)
    out = []
    for j in range(CHUNKS):
        out += root.on_frame(unit(1, j), 0.001 * j)
    acks = sends(out, Kind.ACK)
    assert len(acks) == 1 and acked(acks[0]) == list(range(CHUNKS))
    assert acks[0].target == 1 and acks[0].contributors == frozenset({1})
    # It survives the wire (u32 indices payload, as NACK and PULL).
    again = decode(encode(acks[0]))
    assert isinstance(again, Frame) and again.dtype == DType.U32 and acked(again) == list(range(CHUNKS))


def test_a_lone_unit_is_acked_after_the_ack_delay() -> None:
    root = machine(0)
    root.start(0.0)
    assert sends(root.on_frame(unit(1, 0), 0.0), Kind.ACK) == []
    due = root.next_timer()
    assert due == pytest.approx(min(ACK_DELAY, CFG.fixed_timeout / 4))
    acks = sends(root.on_timer(due), Kind.ACK)  # type: ignore[arg-type]
    assert [acked(a) for a in acks] == [[0]]


def test_at_most_ack_every_units_wait_for_one_ack() -> None:
    chunks = ACK_EVERY + 3
    root = machine(0, chunks=chunks)
    root.start(0.0)
    counts = [len(sends(root.on_frame(unit(1, j, chunks=chunks), 0.0), Kind.ACK)) for j in range(chunks)]
    assert counts[ACK_EVERY - 1] == 1 and sum(counts) == 2 and counts[-1] == 1


def test_a_gap_in_a_batched_ack_retransmits_the_missing_unit_only() -> None:
    leaf = machine(1, 1.0)
    first = sends(leaf.start(0.0), Kind.DATA)
    assert [f.chunk_index for f in first] == list(range(CHUNKS))
    ack = Frame(Kind.ACK, 0, 3, 0, CHUNKS - 1, CHUNKS, origin=0, target=1,
                contributors=frozenset({1})).with_indices([0, 1, 3, 4])  # chunk 2 was lost
    again = sends(leaf.on_frame(ack, 0.01), Kind.DATA)
    assert [f.chunk_index for f in again] == [2]
    assert set(leaf.courier.pending) == {(False, 2, frozenset({1}))}
    assert leaf.stats.retransmits == 1


def test_an_ack_listing_more_indices_than_chunks_is_dropped() -> None:
    leaf = machine(1, 1.0)
    leaf.start(0.0)
    bogus = Frame(Kind.ACK, 0, 3, 0, 0, CHUNKS, origin=0, target=1,
                  contributors=frozenset({1})).with_indices(list(range(CHUNKS + 1)))
    leaf.on_frame(bogus, 0.01)
    assert leaf.stats.dropped == 1 and len(leaf.courier.pending) == CHUNKS


def test_relayed_units_are_still_acked_one_by_one() -> None:
    root = machine(0)
    root.start(0.0)
    relayed = Frame(Kind.RELAY, 0, 3, 2, 0, CHUNKS, Flag.NONE, origin=1, target=0,
                    contributors=frozenset({1})).with_values(np.ones(2, np.float32))
    acks = sends(root.on_frame(relayed, 0.0), Kind.ACK)
    assert len(acks) == 1 and acks[0].payload == b"" and acks[0].target == 1


def test_finishing_the_round_sends_what_waits() -> None:
    leaf = machine(1)
    leaf.start(0.0)
    out = []
    for j in range(CHUNKS - 1):  # the broadcast of all but the last chunk: ACKs wait
        final = Frame(Kind.DATA, 0, 3, 0, j, CHUNKS, Flag.BROADCAST | Flag.FINAL,
                      contributors=frozenset({0, 1, 2})).with_values(np.zeros(2, np.float32))
        out += leaf.on_frame(final, 0.001)
    assert sends(out, Kind.ACK) == [] and leaf.result is None
    leaf.deadline = 0.002  # the round ends here before the last chunk: the batch goes out
    out = leaf.on_timer(0.002)
    assert leaf.result is not None
    assert [acked(a) for a in sends(out, Kind.ACK)] == [list(range(CHUNKS - 1))]
