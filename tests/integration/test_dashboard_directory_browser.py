"""The devices and jobs views in real headless Chromium, 1440 and 390 wide (issue 55).

A real mosquitto holds the retained records of four devices and the documents, execution
states and result of three finished jobs and a running one (agent.jobs' wire, as `edgegrove
device` and `edgegrove job submit` publish them); the dashboard's listener reads them. The
devices view lists every device (labels, architecture, backends, data sources, state, current
job, last seen), the jobs view every job (state, its devices' execution states, rounds,
accuracy, start and end), running first; a new execution state shows without a reload, and
extends the job's accuracy curve (the broker retains only each execution's latest state); at
390 px nothing overflows the page. Screenshots are saved as artifacts.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from playwright.sync_api import Browser, Page

from agent.jobs import topics
from agent.jobs.document import canonical_json
from agent.jobs.states import ExecState
from dashboard.server import run_in_thread
from dashboard.settings import DashboardSettings
from simulate.brokers import free_port, mosquitto_binary
from tests.unit.dashboard.directory_messages import (
    DEVICES,
    FINISHED,
    RUNNING,
    T0,
    exec_status,
    fleet_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ARTIFACTS = Path(os.environ.get("EDGEGROVE_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts"))
WIDTHS = (1440, 390)


@pytest.fixture
def broker_port(tmp_path: Path) -> Iterator[int]:
    """A mosquitto on 127.0.0.1 that lets anyone in: the views read what any broker retains."""
    binary = mosquitto_binary()
    assert binary, "mosquitto is missing (scripts/setup.sh installs it)"
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    process = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "mosquitto did not start"
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)


def publish_retained(port: int, messages: list[tuple[str, bytes]]) -> None:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="operator-test")
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for topic, payload in messages:
            client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


def rows(page: Page, table: str, key: str) -> list[str]:
    return page.eval_on_selector_all(f"#{table} tbody tr[data-{key}]", f"els => els.map(e => e.dataset.{key})")


def save(page: Page, tmp_path: Path, name: str) -> None:
    shot = tmp_path / f"dashboard-{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)


def no_overflow(page: Page) -> bool:
    return bool(page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"))


def test_devices_and_jobs_views_at_1440_and_390(browser: Browser, broker_port: int, tmp_path: Path) -> None:
    publish_retained(broker_port, fleet_messages())
    settings = DashboardSettings(broker_url=f"mqtt://127.0.0.1:{broker_port}", job=RUNNING, port=0)
    with run_in_thread(settings) as served:
        store = served.dashboard.store
        deadline = time.monotonic() + 60
        while len(store.directory.devices) < len(DEVICES) or len(store.directory.jobs) < 4:
            assert time.monotonic() < deadline, f"the dashboard heard {len(store.directory.devices)} devices"
            time.sleep(0.1)
        for width in WIDTHS:
            page = browser.new_page(viewport={"width": width, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
            page.goto(served.url + "#devices")
            page.wait_for_function(f"() => document.querySelectorAll('#devices tbody tr[data-device]').length === {len(DEVICES)}",
                                   timeout=30_000)
            assert page.locator("#devices-view").is_visible() and page.locator("#chart-loss").is_hidden()
            assert rows(page, "devices", "device") == sorted(DEVICES)
            jetson = page.locator('#devices tr[data-device="hall-jetson"]')
            assert jetson.get_attribute("data-state") == "idle" and jetson.get_attribute("data-job") == ""
            pi = page.locator('#devices tr[data-device="barn-pi-1"]').inner_text()
            assert RUNNING in pi and "training" in pi and "site=barn" in pi
            if width == 1440:
                assert "aarch64" in pi and "litert" in pi and "mnist · 6000 samples" in pi
            assert no_overflow(page), f"the devices view overflows {width} px"
            save(page, tmp_path, f"devices-{width}")

            page.click('[data-view-tab="jobs"]')
            page.wait_for_function("() => document.querySelectorAll('#jobs tbody tr[data-job]').length === 4",
                                   timeout=30_000)
            assert rows(page, "jobs", "job") == [RUNNING, *reversed(FINISHED)]  # running first, then newest
            assert rows(page, "jobs", "state") == ["running", "canceled", "failed", "succeeded"]
            live = page.locator(f'#jobs tr[data-job="{RUNNING}"]')
            chips = live.locator(".chip[data-state]").evaluate_all("els => els.map(e => e.textContent)")
            assert chips == ["barn-pi-1 training", "barn-pi-2 training", "hall-jetson rejected", "shop-pi-3 training"]
            assert "120 / 300" in live.inner_text() and "84.0 %" in live.inner_text()
            done = page.locator('#jobs tr[data-job="digits-a"]').inner_text()
            assert "100 / 100" in done and "91.0 %" in done
            if width == 1440:
                assert "operator-ana" in done
            assert no_overflow(page), f"the jobs view overflows {width} px"
            save(page, tmp_path, f"jobs-{width}")
            assert errors == []
            page.close()

        # A device finishes the running job: the open view shows it without a reload.
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(served.url + "#jobs")
        page.wait_for_selector(f'#jobs tr[data-job="{RUNNING}"]', timeout=30_000)
        status = exec_status(RUNNING, "barn-pi-1", 0, ExecState.FAILED, 130, 0.85, T0 + 3300, 13, detail="out of memory")
        publish_retained(broker_port, [(topics.job_exec(RUNNING, "barn-pi-1"), canonical_json(status).encode())])
        page.wait_for_function(
            f"() => [...document.querySelectorAll('#jobs tr[data-job=\"{RUNNING}\"] .chip')]"
            ".some(c => c.textContent === 'barn-pi-1 failed')", timeout=30_000)
        # The broker retains each execution's latest state: the curve is what the dashboard
        # heard, here rounds 120 and 130 of the running job.
        assert page.locator(f'#jobs tr[data-job="{RUNNING}"] svg.curve polyline').count() == 1
        # Two jobs' curves laid over one another.
        assert page.locator("#job-curves canvas").count() == 0
        for job in (RUNNING, "digits-a"):
            page.check(f'#jobs input[data-compare="{job}"]')
        page.wait_for_function(f"() => document.querySelector('#job-curves').dataset.jobs === '{RUNNING},digits-a'"
                               " && document.querySelector('#job-curves canvas') !== null", timeout=10_000)
        legend = page.inner_text("#job-curves .u-legend")
        assert RUNNING in legend and "digits-a" in legend
        save(page, tmp_path, "jobs-compare-1440")
        page.click('[data-view-tab="fleet"]')
        page.wait_for_selector("#chart-loss", state="visible")
        assert page.locator("#jobs-view").is_hidden()
        page.close()
