"""Each node's own series (dashboard/node_series.py): in round order, bounded, paged."""

from __future__ import annotations

import pytest

from agent.protocol.messages import Telemetry
from dashboard.node_series import NodeSeriesBook


def report(node: int, round_no: int, **extra: object) -> Telemetry:
    fields: dict[str, object] = {"phase_seconds": {"total": 0.1 * (round_no + 1)}, "cpu_percent": 50.0 + round_no,
                                 "rss_bytes": 1000 * (round_no + 1), "bytes_sent": 10 * round_no,
                                 "bytes_received": 20 * round_no}
    fields.update(extra)
    return Telemetry(node, round_no, 1, "ft-tree", 0.0, **fields)  # type: ignore[arg-type]


def test_a_nodes_rounds_come_back_as_reported() -> None:
    book = NodeSeriesBook()
    for r in range(5):
        book.add(report(3, r))
    book.add(report(4, 0))
    page = book.page(3)
    assert [p.round for p in page.points] == [0, 1, 2, 3, 4]
    p = page.points[2]
    assert (p.round_seconds, p.cpu_percent, p.rss_bytes, p.bytes_sent, p.bytes_received) == (
        pytest.approx(0.3), 52.0, 3000, 20, 40)
    assert (page.first_round, page.last_round, page.dropped) == (0, 4, 0)
    assert book.nodes() == [3, 4] and 5 not in book
    assert book.page(5).points == []


def test_unsaid_values_are_none_and_late_or_repeated_rounds_keep_order() -> None:
    book = NodeSeriesBook()
    book.add(report(1, 0, cpu_percent=None, rss_bytes=0, phase_seconds={}))
    book.add(report(1, 3))
    book.add(report(1, 2))  # late
    book.add(report(1, 3, bytes_sent=999))  # the same round again: the last report wins
    points = book.page(1).points
    assert [p.round for p in points] == [0, 2, 3]
    assert (points[0].cpu_percent, points[0].rss_bytes, points[0].round_seconds) == (None, None, None)
    assert points[2].bytes_sent == 999


def test_memory_is_bounded_per_node_and_the_dropped_are_counted() -> None:
    book = NodeSeriesBook(max_points=64)
    for r in range(1000):
        book.add(report(0, r))
    page = book.page(0)
    assert len(page.points) <= 64 and page.points[-1].round == 999
    assert page.dropped == 1000 - len(page.points) and page.first_round == page.points[0].round
    book.add(report(0, 1))  # older than what is kept: gone already, not re-added
    assert book.page(0).points[0].round == page.first_round
    with pytest.raises(ValueError):
        NodeSeriesBook(max_points=2)


def test_pages_like_the_rounds_api() -> None:
    book = NodeSeriesBook()
    for r in range(10):
        book.add(report(2, r))
    assert [p.round for p in book.page(2, since=3, limit=2).points] == [4, 5]
    assert [p.round for p in book.page(2, before=7, limit=2).points] == [5, 6]
    assert [p.round for p in book.page(2, limit=3).points] == [7, 8, 9]
    assert [p.round for p in book.page(2, since=2, before=5).points] == [3, 4]
    assert book.page(2, since=20).points == []
