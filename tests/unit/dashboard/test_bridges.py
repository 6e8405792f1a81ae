"""Sites' bridges: the broker's notifications and the simulator's uplink records, each through
BridgeReport into the pure reducer; bad input rejected and counted."""

from __future__ import annotations

import pytest

from agent.protocol.messages import MessageError
from agent.protocol.topics import Topics
from dashboard.bridges import (
    MAX_SITES,
    BridgeReport,
    apply_bridge,
    notification_report,
    uplink_reports,
)
from dashboard.records import apply_record
from dashboard.state import FleetState, Result
from dashboard.store import FleetStore

TOPICS = Topics("sites")


def notified(state: FleetState, site: str, payload: bytes, now: float) -> Result:
    return apply_bridge(state, notification_report(site, payload), now)


def uplinks(state: FleetState, now: float, cut: list[str] | None = None, **counts: list[int]) -> Result:
    record: dict[str, object] = {"type": "uplinks", "bytes": counts}
    if cut is not None:
        record["cut"] = cut
    return apply_record(state, record, now)


def test_a_bridge_going_down_and_up_is_two_events_with_since_and_downs() -> None:
    state, events = notified(FleetState(), "s1", b"1", 1.0)
    assert events == ()  # first seen working: not news
    assert (state.bridges["s1"].state, state.bridges["s1"].since) == ("up", 1.0)
    state, events = notified(state, "s1", b"0", 5.0)
    assert [e.kind for e in events] == ["bridge_down"]
    assert "site s1: bridge up -> down" in events[0].detail
    state, events = notified(state, "s1", b"0", 6.0)  # retained again on a resubscribe
    assert events == () and state.bridges["s1"].since == 5.0
    state, events = notified(state, "s1", b"1", 9.0)
    bridge = state.bridges["s1"]
    assert [e.kind for e in events] == ["bridge_up"]
    assert (bridge.state, bridge.since, bridge.downs, bridge.source) == ("up", 9.0, 1, "broker")


@pytest.mark.parametrize("payload", [b"", b"2", b"up", b"1\x00", b"true"])
def test_a_notification_other_than_1_or_0_is_rejected(payload: bytes) -> None:
    with pytest.raises(MessageError) as caught:
        notification_report("s1", payload)
    assert caught.value.reason == "bridge_invalid"


def test_the_store_reads_bridge_topics_and_counts_bad_ones() -> None:
    store = FleetStore(TOPICS, FleetState(), clock=lambda: 3.0)
    store.ingest(TOPICS.bridge("s0"), b"0")
    store.ingest(TOPICS.bridge("s0"), b"maybe")
    store.ingest(f"{TOPICS.prefix}/bridge/bad site", b"1")  # not a site name: no bridge topic
    assert store.state.bridges["s0"].state == "down"
    assert dict(store.state.counters.malformed) == {"bridge_invalid": 1, "unknown_topic": 1}
    assert [e.kind for e in store.history] == ["bridge_down"]


def test_uplink_bytes_give_a_rate_over_a_window_of_a_second_or_more() -> None:
    state, _ = uplinks(FleetState(), 10.0, s0=[1000, 4000])
    bridge = state.bridges["s0"]
    assert (bridge.bytes_up, bridge.bytes_down, bridge.rate_up) == (1000, 4000, None)
    state, _ = uplinks(state, 10.4, s0=[1400, 4400])  # too soon for a rate
    assert (state.bridges["s0"].bytes_up, state.bridges["s0"].rate_up) == (1400, None)
    state, _ = uplinks(state, 12.0, s0=[3000, 10000])
    bridge = state.bridges["s0"]
    assert bridge.rate_up == pytest.approx(1000.0) and bridge.rate_down == pytest.approx(3000.0)
    assert bridge.state == "unknown"  # a record without "cut" says nothing of the state
    state, _ = uplinks(state, 13.5, s0=[10, 10])  # counters started again: no rate
    assert (state.bridges["s0"].bytes_up, state.bridges["s0"].rate_up) == (10, None)


def test_the_simulators_cut_sets_the_state_until_the_broker_speaks() -> None:
    state, events = uplinks(FleetState(), 1.0, cut=["s1"], s0=[0, 0], s1=[0, 0])
    assert (state.bridges["s0"].state, state.bridges["s1"].state) == ("up", "down")
    assert [e.kind for e in events] == ["bridge_down"]
    assert "the simulator's uplink" in events[0].detail
    state, _ = notified(state, "s1", b"0", 2.0)
    assert state.bridges["s1"].source == "broker"
    # The uplink is back, the bridge not yet redialled: the broker's word stands.
    state, events = uplinks(state, 3.0, cut=[], s0=[5, 5], s1=[5, 5])
    assert state.bridges["s1"].state == "down" and events == ()
    assert state.bridges["s1"].bytes_up == 5


@pytest.mark.parametrize("record", [
    {"type": "uplinks", "bytes": [[1, 2]]},
    {"type": "uplinks", "bytes": {"s0": [1]}},
    {"type": "uplinks", "bytes": {"s0": [-1, 2]}},
    {"type": "uplinks", "bytes": {"s0": [1.5, 2]}},
    {"type": "uplinks", "bytes": {"s0": ["1", 2]}},
    {"type": "uplinks", "bytes": {"s0": [True, 2]}},
    {"type": "uplinks", "bytes": {"s 0": [1, 2]}},
    {"type": "uplinks", "bytes": {"x" * 33: [1, 2]}},
    {"type": "uplinks", "bytes": {"s0": [1, 2]}, "cut": "s0"},
    {"type": "uplinks"},
])
def test_a_malformed_uplinks_record_is_counted_and_changes_no_bridge(record: dict) -> None:
    good, _ = uplinks(FleetState(), 1.0, s9=[1, 1])
    state, events = apply_record(good, record, 2.0)
    assert events == ()
    assert state.bridges == good.bridges
    assert dict(state.counters.malformed) == {"bridge_invalid": 1}


def test_the_report_model_takes_only_what_it_names() -> None:
    with pytest.raises(ValueError):
        BridgeReport.model_validate({"site": "s0", "source": "broker", "connected": 1})  # strict
    with pytest.raises(ValueError):
        BridgeReport.model_validate({"site": "s0", "source": "someone"})
    with pytest.raises(ValueError):
        BridgeReport.model_validate({"site": "s0", "source": "broker", "rate": 5})
    assert uplink_reports({"bytes": {}}) == []


def test_no_more_than_max_sites_bridges_are_kept() -> None:
    store = FleetStore(TOPICS, FleetState(), clock=lambda: 1.0)
    for i in range(MAX_SITES + 3):
        store.ingest(TOPICS.bridge(f"s{i}"), b"1")
    assert len(store.state.bridges) == MAX_SITES
    assert store.state.counters.malformed["bridge_invalid"] == 3
