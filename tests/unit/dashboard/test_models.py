"""The fleet as the API serves it: nodes grouped by site, each site with its bridge."""

from __future__ import annotations

from agent.protocol.messages import Status, View
from dashboard.bridges import apply_bridge, notification_report
from dashboard.models import BrokerModel, FleetModel, fleet_model
from dashboard.records import apply_record
from dashboard.state import FleetState, apply_status, apply_view

BROKER = BrokerModel(url=None, connected=False, last_error="", connects=0)


def served(state: FleetState, wall_offset: float = 0.0) -> FleetModel:
    return fleet_model(state, "job", BROKER, False, now=20.0, wall_offset=wall_offset)


def fleet_of(sites: dict[int, str], view_sites: list[str] | None = None) -> FleetState:
    state = FleetState()
    for node, site in sites.items():
        state, _ = apply_status(state, Status(node, "online", incarnation=1, site=site), 1.0)
    members = sorted(sites)
    state, _ = apply_view(state, View(1, members, 2, 0, 0, sites=view_sites or []), 1.0)
    return state


def test_a_fleet_without_sites_has_none() -> None:
    fleet = served(fleet_of({0: "", 1: "", 2: ""}))
    assert fleet.sites == []
    assert {n.site for n in fleet.nodes} == {""}


def test_nodes_are_grouped_by_the_site_their_status_names() -> None:
    state = fleet_of({0: "barn", 1: "barn", 2: "hall", 3: "hall", 4: "hall"})
    fleet = served(state)
    assert [(s.name, s.nodes, s.bridge) for s in fleet.sites] == [
        ("barn", [0, 1], None), ("hall", [2, 3, 4], None)]
    assert [n.site for n in fleet.nodes] == ["barn", "barn", "hall", "hall", "hall"]


def test_a_node_whose_status_names_no_site_takes_the_views() -> None:
    state = fleet_of({0: "", 1: "", 2: ""}, view_sites=["s0", "s0", "s1"])
    assert [(s.name, s.nodes) for s in served(state).sites] == [("s0", [0, 1]), ("s1", [2])]


def test_each_site_carries_its_bridge_in_unix_time() -> None:
    state = fleet_of({0: "s0", 1: "s1"})
    state, _ = apply_record(state, {"type": "uplinks", "bytes": {"s0": [0, 0], "s1": [0, 0]}}, 2.0)
    state, _ = apply_record(state, {"type": "uplinks", "bytes": {"s0": [300, 900], "s1": [5, 5]}}, 5.0)
    state, _ = apply_bridge(state, notification_report("s1", b"0"), 6.0)
    sites = {s.name: s for s in served(state, wall_offset=1000.0).sites}
    s0, s1 = sites["s0"].bridge, sites["s1"].bridge
    assert s0 is not None and s1 is not None
    assert (s0.state, s0.bytes_up, s0.bytes_down, s0.rate_up, s0.rate_down) == ("unknown", 300, 900, 100.0, 300.0)
    assert (s1.state, s1.since, s1.downs, s1.source, s1.sampled_at) == ("down", 1006.0, 1, "broker", 1005.0)


def test_a_bridge_with_no_node_yet_is_a_site_of_its_own() -> None:
    state, _ = apply_bridge(FleetState(), notification_report("far", b"1"), 1.0)
    fleet = served(state)
    assert [(s.name, s.nodes) for s in fleet.sites] == [("far", [])]
    assert fleet.sites[0].bridge is not None and fleet.sites[0].bridge.state == "up"
