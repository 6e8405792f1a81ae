"""`GET /metrics` during a real run: `edgegrove simulate` (mosquitto, five agent processes
training MNIST, a link cut) with its dashboard scraped every few tenths of a second. Every
scrape parses with prometheus-client's own text parser; the counters never go back; and the
run's final values match the simulator's rounds.csv (rounds, bytes, reroutes, timeouts,
degraded rounds, each node's last round). An agent that runs a round again (a loaded host
makes it happen) reports it twice: the counters count both reports, as bytes really sent
twice, and rounds.csv keeps the second; the same report received twice (an agent's QoS 1
resend under load) counts once, here as in the simulator's events.jsonl. The test checks the
counters against every report in events.jsonl, and that those are the ones rounds.csv sums."""

from __future__ import annotations

import csv
import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.metrics import fleet_registry
from simulate.scenario import parse_scenario
from simulate.simulation import Simulation

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
ROUNDS = 40
SCENARIO = f"""
name = "metrics"
[fleet]
nodes = 5
rounds = {ROUNDS}
[agent]
algorithm = "ft-tree"
eval_every = 10
[[faults]]
kind = "link"
nodes = [1, 3]
at_round = 10
heal_round = 20
"""
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "fleet_job"))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_during_a_run_match_its_rounds_csv(tmp_path: Path) -> None:
    sim = Simulation(parse_scenario(SCENARIO), tmp_path / "run", broker_choice="mosquitto",
                     dashboard_port=0, baseline=False, stall_timeout=120)
    result: dict[str, object] = {}
    runner = threading.Thread(target=lambda: result.update(sim.run()), name="simulate")
    runner.start()
    scrapes: list[Samples] = []
    try:
        while runner.is_alive():
            url = sim.dashboard_url
            if url is not None:
                try:
                    with urllib.request.urlopen(url + "metrics", timeout=5) as reply:
                        assert reply.headers["Content-Type"].startswith("text/plain")
                        scrapes.append(parse(reply.read().decode()))
                except OSError:
                    pass  # not yet listening, or already stopped
            time.sleep(0.3)
    finally:
        sim.stop_event.set()
        runner.join(120)
    during = [s for s in scrapes if 0 < value(s, "edgegrove_rounds_total") < ROUNDS]
    assert len(during) >= 5, f"only {len(during)} scrapes while the fleet trained"
    for name in ("edgegrove_rounds_total", "edgegrove_bytes_sent_total", "edgegrove_reroutes_total"):
        series = [value(s, name) for s in scrapes if (name, ()) in s]
        assert series == sorted(series), f"{name} went back: {series}"
    # The final state, through the same collector /metrics serves, in the same text format.
    handle = sim.dashboard_handle
    assert handle is not None
    final = parse(generate_latest(fleet_registry(lambda: handle.dashboard.store.state, "x")).decode())
    rows = list(csv.DictReader((sim.run_dir / "rounds.csv").open()))
    total = lambda key: sum(int(r[key]) for r in rows)  # noqa: E731
    reports = [r for r in map(json.loads, (sim.run_dir / "events.jsonl").read_text().splitlines())
               if r["type"] == "telemetry"]
    latest = {(r["node"], r["round"]): r for r in reports}  # a round run again: its last report
    every = lambda key: sum(int(r.get(key, 0)) for r in reports)  # noqa: E731
    for key in ("bytes_sent", "reroutes", "timeouts"):
        assert sum(int(r.get(key, 0)) for r in latest.values()) == total(key), key
    assert value(final, "edgegrove_rounds_total") == len(rows) == ROUNDS
    assert value(final, "edgegrove_bytes_sent_total") == every("bytes_sent")
    assert value(final, "edgegrove_reroutes_total") == every("reroutes") > 0  # the cut rerouted
    assert value(final, "edgegrove_timeouts_total") == every("timeouts")
    degraded = {r["round"] for r in reports if r.get("degraded")}
    assert value(final, "edgegrove_degraded_rounds_total") == len(degraded)
    assert value(final, "edgegrove_latest_round") == ROUNDS - 1
    assert value(final, "edgegrove_finished") == 1
    node_bytes = sum(value(final, "edgegrove_node_bytes_sent_total", node=str(n)) for n in range(5))
    assert node_bytes == every("bytes_sent")
    for n in range(5):
        assert value(final, "edgegrove_node_last_round", node=str(n)) == ROUNDS - 1
    print(f"\n{len(scrapes)} scrapes, {len(during)} while training; final: {len(rows)} rounds, "
          f"{every('bytes_sent'):,} bytes, {every('reroutes')} reroutes; "
          f"{len(reports) - len(latest)} rounds run again")
