"""The operator restarts the broker from the page (issue 55.3), in real headless Chromium.

`edgegrove simulate`'s own run (its mosquitto with dynamic security, three agent processes,
no scenario faults) with its dashboard. From the Fault controls form the operator restarts
the broker for 2 s: the simulator carries it out on its own mosquitto (the event log says
stopped, then started), the page shows it as the operator's broker-restart incident from the
round it was sent until the broker is back, and the fleet trains on after it.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from simulate.cli import Simulation
from simulate.scenario import parse_scenario

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
ARTIFACTS = Path(os.environ.get("EDGEGROVE_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts"))
SCENARIO = 'name = "broker-command"\n[fleet]\nnodes = 3\nrounds = 2000\n[agent]\neval_every = 0\n'
OUTAGE_S = 2
ROUND_SHOWN = "Number(document.querySelector('[data-counter=\"round\"] .value')?.textContent || 0)"
BROKER_INCIDENT = ("() => (model.fleet.incidents.find(i => i.kind === 'broker-restart' && i.source === 'operator')"
                   " || {}).end_round ?? null")


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Simulation]:
    simulation = Simulation(parse_scenario(SCENARIO), tmp_path / "run", broker_choice="mosquitto",
                            dashboard_port=0, baseline=False, stall_timeout=120)
    thread = threading.Thread(target=simulation.run, name="simulate")
    thread.start()
    try:
        wait_until(lambda: simulation.dashboard_url is not None or not thread.is_alive(), 240,
                   "the simulator's dashboard")
        assert simulation.dashboard_url is not None, "the simulator stopped before its dashboard started"
        yield simulation
    finally:
        simulation.stop_event.set()
        simulation.watch.poke()
        thread.join(120)


def broker_records(sim: Simulation) -> list[dict[str, Any]]:
    lines = (sim.run_dir / "events.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, (x for x in lines if x.endswith("}"))) if r["type"] == "broker" and "event" in r]


def test_the_operator_restarts_the_simulators_broker_from_the_page(
        browser: Browser, sim: Simulation, tmp_path: Path) -> None:
    assert sim.dashboard_handle is not None and sim.dashboard_url is not None
    token = sim.dashboard_handle.dashboard.settings.control_token
    assert token is not None
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept())  # "Really restart the broker?"
    page.goto(sim.dashboard_url)
    page.wait_for_function(f"() => {ROUND_SHOWN} >= 3", timeout=240_000)
    page.fill("#control-token", token)
    page.select_option("#control-action", "broker_restart")
    assert page.is_disabled("#control-node") and page.is_enabled("#control-value")
    page.fill("#control-value", str(OUTAGE_S))
    page.click("#control-send")
    page.wait_for_function("() => document.querySelector('#control-result').dataset.state === 'applied'",
                           timeout=60_000)
    assert f"broker stopped, back in {OUTAGE_S} s" in page.inner_text("#control-result")
    incident = page.locator('#incidents li[data-kind="broker-restart"][data-source="operator"]')
    assert "the broker" in incident.inner_text() and "made by the operator" in incident.inner_text()
    sent_round = int(incident.get_attribute("data-start") or -1)
    assert sent_round >= 3
    wait_until(lambda: [r["event"] for r in broker_records(sim)] == ["stopped", "started"], 60,
               "the simulator's broker stopped and started again")
    stopped, started = broker_records(sim)
    assert OUTAGE_S <= started["wall"] - stopped["wall"] < OUTAGE_S + 10
    page.wait_for_function(f"{BROKER_INCIDENT} !== null", timeout=60_000)
    end_round = int(page.evaluate(f"({BROKER_INCIDENT})()"))
    assert end_round >= sent_round
    # The fleet trains on after the restart: the page's round moves on by five more.
    page.wait_for_function(f"() => {ROUND_SHOWN} >= {end_round + 5}", timeout=240_000)
    page.wait_for_function("() => document.querySelector('#broker-pill').dataset.ok === 'true'", timeout=60_000)
    shot = tmp_path / "dashboard-operator-broker-restart.png"
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)
    assert errors == []
    page.close()
