"""bench broker without a broker: bytes per allreduce, the bound, figures of a repeat."""

from __future__ import annotations

import argparse

import pytest

from agent.protocol import wire
from simulate.bench import broker


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    broker.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_default_sizes_are_a_chunk_frame_and_the_whole_gradient() -> None:
    chunk = wire.encode(wire.Frame(wire.Kind.DATA, 1, 0, 0, contributors=frozenset({0, 6}),
                                   payload=bytes(4 * 16384)))
    whole = wire.encode(wire.Frame(wire.Kind.DATA, 1, 0, 0, contributors=frozenset({0}),
                                   payload=bytes(4 * 407_050)))
    assert [len(chunk), len(whole)] == broker.DEFAULT_SIZES
    assert 64 * 1024 < broker.CHUNK_FRAME_BYTES < 64 * 1024 + 100


@pytest.mark.parametrize(("values", "ids", "dtype"), [
    (16384, frozenset({0, 1, 2}), wire.DType.F32), (0, frozenset({3, 9}), wire.DType.F32),
    (100, frozenset(range(31)), wire.DType.F16), (7, frozenset(), wire.DType.I8)])
def test_frame_bytes_matches_the_encoder(values: int, ids: frozenset[int], dtype: wire.DType) -> None:
    item = {wire.DType.F32: 4, wire.DType.F16: 2, wire.DType.I8: 1}[dtype]
    frame = wire.Frame(wire.Kind.DATA, 1, 0, 0, contributors=ids, dtype=dtype, payload=bytes(item * values))
    assert broker.frame_bytes(values, ids, dtype) == len(wire.encode(frame))


def test_mqtt_publish_size_counts_header_topic_and_payload() -> None:
    assert broker.mqtt_publish_bytes("ab", 10) == 1 + 1 + 2 + 2 + 10
    assert broker.mqtt_publish_bytes("ab", 200) == 1 + 2 + 2 + 2 + 200
    assert broker.mqtt_publish_bytes("ab", 3_000_000) == 1 + 4 + 2 + 2 + 3_000_000


def test_two_nodes_send_the_gradient_up_and_down_once() -> None:
    t = broker.allreduce_traffic(2, n_values=100, chunk_values=40, acks=False, prefix="p")
    assert t.chunks == 3 and t.messages == 6  # 3 chunks up, 3 down
    payload = 4 * 100 * 2
    assert payload < t.ingress_bytes < payload + 6 * 80
    assert t.egress_bytes == t.ingress_bytes and t.total_bytes == 2 * t.ingress_bytes


def test_traffic_grows_with_the_tree_edges_and_counts_acks() -> None:
    t7, t15 = broker.allreduce_traffic(7), broker.allreduce_traffic(15)
    assert t7.chunks == 25 and t7.messages == 6 * 2 * 25 * 2
    gradient = 4 * broker.MODEL_VALUES
    assert 6 * 2 * gradient < t7.ingress_bytes < 6 * 2 * gradient * 1.01
    assert t15.ingress_bytes > 2 * t7.ingress_bytes
    fanout = broker.allreduce_traffic(7, subscribers_per_link=2)
    assert fanout.egress_bytes == 2 * t7.egress_bytes
    assert broker.allreduce_traffic(7, dtype=wire.DType.I8).total_bytes < t7.total_bytes / 3
    assert broker.allreduce_traffic(1).total_bytes == 0
    with pytest.raises(ValueError):
        broker.allreduce_traffic(0)


def test_bound_is_bytes_over_throughput() -> None:
    assert broker.bound_seconds(500e6, 250e6) == 2.0
    with pytest.raises(ValueError, match="positive"):
        broker.bound_seconds(1, 0)


def _row(broker_name: str, size: int, subs: int, mb_s: float) -> dict[str, object]:
    return {"broker": broker_name, "payload_bytes": size, "subscribers": subs,
            "broker_mb_s": {"median": mb_s}}


def test_throughput_picks_the_closest_measured_size() -> None:
    doc = {"results": [_row("mosquitto", 65_000, 1, 400.0), _row("mosquitto", 1_600_000, 1, 200.0),
                       _row("mosquitto", 65_000, 6, 900.0), _row("embedded", 65_000, 1, 50.0),
                       {"broker": "mosquitto", "payload_bytes": 70_000, "subscribers": 1, "error": "x"}]}
    assert broker.throughput_from(doc, 70_000) == 400e6
    assert broker.throughput_from(doc, 1_000_000) == 200e6
    assert broker.throughput_from(doc, 70_000, subscribers=6) == 900e6
    assert broker.throughput_from(doc, 70_000, broker="embedded") == 50e6
    with pytest.raises(ValueError, match="bench broker"):
        broker.throughput_from(doc, 70_000, subscribers=3)


def test_bound_table_per_tree_size() -> None:
    rows = broker.bound_table(100e6, sizes=(7, 15))
    assert [r["nodes"] for r in rows] == [7, 15]
    assert rows[0]["bound_ms"] == pytest.approx(1000 * rows[0]["total_bytes"] / 100e6, abs=1e-3)


def test_repeat_figures_from_reports() -> None:
    case = broker.Case("mosquitto", 1000, 2, 10, 1, 0)
    reports = [{"first": 1.1, "last": 2.0, "count": 10, "bytes": 10_000},
               {"first": 1.2, "last": 3.0, "count": 8, "bytes": 8_000}]
    figures = broker.repeat_figures(case, "t", 1.0, reports)
    assert figures["seconds"] == 2.0 and figures["lost"] == 2
    assert figures["delivered_mb_s"] == pytest.approx(18_000 / 2.0 / 1e6)
    wire_bytes = broker.mqtt_publish_bytes("t", 1000)
    assert figures["broker_mb_s"] == pytest.approx((10 + 18) * wire_bytes / 2.0 / 1e6)
    nothing = broker.repeat_figures(case, "t", 1.0, [{"first": None, "last": None, "count": 0, "bytes": 0}] * 2)
    assert nothing == {"lost": 20}


def test_case_result_takes_medians_and_reports_when_nothing_arrived() -> None:
    case = broker.Case("mosquitto", 1000, 1, 10, 3, 0)
    samples = [{"seconds": s, "delivered_mb_s": 1 / s, "broker_mb_s": 2 / s, "messages_per_s": 10 / s,
                "lost": 0} for s in (1.0, 2.0, 4.0)]
    result = broker._case_result(case, samples)
    assert result["broker_mb_s"]["median"] == 1.0 and result["seconds"]["n"] == 3
    assert "error" in broker._case_result(case, [{"lost": 10}])


def test_messages_per_repeat_covers_the_volume() -> None:
    assert broker.messages_per_repeat(1_000_000, 32) == 32
    assert broker.messages_per_repeat(10_000_000, 1) == 4


@pytest.mark.parametrize("argv", [["--sizes", "8"], ["--sizes", "9000000"], ["--subscribers", "0"],
                                  ["--repeats", "0"], ["--megabytes", "0"]])
def test_bad_options_exit_2_before_any_broker_starts(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert broker.run(_args(*argv)) == 2
    assert "bench broker" in capsys.readouterr().err


def test_cases_use_the_volume_of_each_broker() -> None:
    args = _args("--sizes", "1000", "--subscribers", "1", "3", "--megabytes", "1", "--embedded-megabytes", "0.1")
    cases = broker.cases_for(args, "mosquitto")
    assert [(c.subscribers, c.messages) for c in cases] == [(1, 1000), (3, 1000)]
    assert broker.cases_for(args, "embedded")[0].messages == 100


def test_table_shows_errors_and_the_bound() -> None:
    doc = broker._document(_args(), [
        {"broker": "mosquitto", "payload_bytes": 65_585, "subscribers": 1, "messages": 5, "lost": 0,
         "delivered_mb_s": {"median": 100.0}, "broker_mb_s": {"median": 200.0, "p10": 190.0, "p90": 210.0}},
        {"broker": "embedded", "payload_bytes": 65_585, "subscribers": 1, "error": "boom"}])
    assert doc["bound"]["throughput_mb_s"] == 200.0
    assert [t["nodes"] for t in doc["bound"]["trees"]] == [7, 15, 31, 63]
    text = broker.render_table(doc)
    assert "error: boom" in text and "bound ms" in text


def test_publishes_name_sender_and_receiver_of_every_data_chunk_and_ack() -> None:
    pubs = list(broker.allreduce_publishes(2, n_values=100, chunk_values=40, prefix="p"))
    assert [(p.sender, p.receiver, p.topic) for p in pubs] == (
        [(1, 0, "p/link/1/0"), (0, 1, "p/link/0/1")] * 3 + [(0, 1, "p/link/0/1"), (1, 0, "p/link/1/0")] * 3)
    assert [p.frame_bytes for p in pubs[:2]] == [broker.frame_bytes(40, frozenset({1})), broker.frame_bytes(0, frozenset({1}))]
    assert pubs[0].mqtt_bytes == broker.mqtt_publish_bytes("p/link/1/0", pubs[0].frame_bytes)
    assert sum(p.mqtt_bytes for p in pubs) == broker.allreduce_traffic(2, n_values=100, chunk_values=40,
                                                                       prefix="p").ingress_bytes
