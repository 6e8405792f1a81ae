"""Bridged site runs (simulate.sites_sim): the uplinks records, one per fleet round (`bench
sites --real` reads those), and between rounds at least every UPLINK_SAMPLE_S without a round
(the dashboard's bridge rates)."""

from __future__ import annotations

from typing import Any

from dashboard.records import SIMULATOR_ONLY
from simulate.sites_sim import UPLINK_SAMPLE_S, UplinkLog
from simulate.telemetry import EventLog


class FakeSites:
    def __init__(self) -> None:
        self.record: dict[str, Any] = {"bytes": {"s0": [0, 0], "s1": [0, 0]}, "cut": []}

    def uplinks_record(self) -> dict[str, Any]:
        return dict(self.record)


def test_uplinks_are_logged_per_round_and_between_rounds() -> None:
    clock = [100.0]
    log = EventLog(None, clock=lambda: clock[0])
    sites = FakeSites()
    uplinks = UplinkLog(sites, log, clock=lambda: clock[0])  # type: ignore[arg-type]
    fed: list[dict[str, Any]] = []
    log.listeners.append(fed.append)  # as the dashboard's feed is
    uplinks.sample(3)
    clock[0] += 0.4
    uplinks.sample(3)  # the same round, too soon: nothing
    sites.record = {"bytes": {"s0": [10, 20], "s1": [5, 5]}, "cut": ["s1"]}
    clock[0] += UPLINK_SAMPLE_S
    uplinks.sample(3)  # the fleet waits: a sample without a round
    uplinks.sample(4)
    assert [(r.get("round"), r["cut"]) for r in fed] == [(3, []), (None, ["s1"]), (4, ["s1"])]
    assert fed[1]["bytes"] == {"s0": [10, 20], "s1": [5, 5]}
    assert "uplinks" in SIMULATOR_ONLY  # the dashboard takes them from the simulator's feed
