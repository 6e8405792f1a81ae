"""The devices' warnings and errors in the page's Logs view, in real headless Chromium (55.5).

A real mosquitto holds the retained records and executions of a small fleet of devices and
jobs (barn-pi-1 and shop-pi-3 train
digits-live, at round 120). Two devices' real log forwarders
(agent.device.logs.LogForwarder, on paho clients of their own, as `edgegrove device` runs it)
publish WARNING-and-above lines of their `edgegrove` loggers on their log topics; the dashboard's
listener reads them. The Logs view shows each line at its device's round, filters by level and
device, searches, and follows new lines without a reload. Screenshots at 1440 and 390 wide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from playwright.sync_api import Browser, Page

from agent.device.logs import LogForwarder
from agent.jobs import topics
from dashboard.server import run_in_thread
from dashboard.settings import DashboardSettings
from tests.integration.conftest import wait_until
from tests.integration.test_dashboard_directory_browser import (  # noqa: F401 (broker_port: a fixture)
    broker_port,
    no_overflow,
    publish_retained,
    save,
)
from tests.unit.dashboard.directory_messages import RUNNING, fleet_messages

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Device:
    """A device's log forwarder on its own MQTT client, on a logger of its own."""

    def __init__(self, name: str, port: int) -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"logs-test-{name}")
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.forwarder = LogForwarder(name, topics.device_log(name), self._publish, 50.0, time.time)
        self.logger = logging.getLogger(f"edgegrove.logs-test.{name}")
        self.logger.propagate = False
        self.logger.addHandler(self.forwarder)

    def _publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=0)

    def close(self) -> None:
        self.logger.removeHandler(self.forwarder)
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def devices(broker_port: int) -> Iterator[dict[str, Device]]:  # noqa: F811
    made = {name: Device(name, broker_port) for name in ("barn-pi-1", "shop-pi-3")}
    try:
        yield made
    finally:
        for device in made.values():
            device.close()


def shown(page: Page, key: str) -> list[str]:
    return page.eval_on_selector_all(f"#logs tbody tr[data-{key}]", f"els => els.map(e => e.dataset.{key})")


def lines(page: Page) -> list[str]:
    return page.eval_on_selector_all("#logs tbody td.line", "els => els.map(e => e.textContent)")


def wait_rows(page: Page, count: int) -> None:
    page.wait_for_function(f"() => document.querySelectorAll('#logs tbody tr[data-seq]').length === {count}",
                           timeout=30_000)


def test_device_logs_searched_filtered_followed_at_their_round(
        browser: Browser, broker_port: int, devices: dict[str, Device], tmp_path: Path) -> None:  # noqa: F811
    publish_retained(broker_port, fleet_messages())
    settings = DashboardSettings(broker_url=f"mqtt://127.0.0.1:{broker_port}", job=RUNNING, port=0)
    with run_in_thread(settings) as served:
        store = served.dashboard.store
        wait_until(lambda: "barn-pi-1" in store.directory.devices and RUNNING in store.directory.jobs,
                   what="the devices' records")
        pi1, pi3 = devices["barn-pi-1"].logger, devices["shop-pi-3"].logger
        # Each line waits for the one before at the dashboard: two devices' connections keep
        # no order between them, and the page shows lines in the order they came.
        pi1.warning("parent 0 silent for 3.0 s, rerouting to 2")
        pi1.info("an info line stays on the device")
        wait_until(lambda: len(store.device_logs.lines) == 1, what="the first log line at the dashboard")
        pi3.error("training failed: out of memory")
        wait_until(lambda: len(store.device_logs.lines) == 2, what="the second log line at the dashboard")
        pi1.warning("Broker connection lost, reconnecting")
        wait_until(lambda: len(store.device_logs.lines) == 3, what="three log lines at the dashboard")
        for width in (1440, 390):
            page = browser.new_page(viewport={"width": width, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
            page.goto(served.url + "#logs")
            wait_rows(page, 3)
            assert page.locator("#logs-view").is_visible() and page.locator("#chart-loss").is_hidden()
            assert shown(page, "device") == ["barn-pi-1", "shop-pi-3", "barn-pi-1"]  # newest first
            assert shown(page, "round") == ["120"] * 3  # both train digits-live, at round 120
            assert "node 0" in page.locator('#logs tbody tr[data-device="barn-pi-1"]').first.inner_text()
            assert no_overflow(page), f"the logs view overflows {width} px"
            save(page, tmp_path, f"logs-{width}")
            assert errors == []
            page.close()

        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(served.url + "#logs")
        wait_rows(page, 3)
        page.select_option("#logs-level", "error")
        wait_rows(page, 1)
        assert lines(page) == ["training failed: out of memory"]
        page.select_option("#logs-level", "warning")
        page.select_option("#logs-device", "barn-pi-1")
        wait_rows(page, 2)
        page.fill("#logs-q", "broker")
        wait_rows(page, 1)
        assert lines(page) == ["Broker connection lost, reconnecting"]
        # Following live: a new matching line shows without a reload, a non-matching one not.
        page.fill("#logs-q", "")
        wait_rows(page, 2)
        pi3.critical("checkpoint unreadable")
        pi1.error("round 130 timed out waiting for 3")
        page.wait_for_function("() => document.querySelector('#logs tbody td.line').textContent"
                               ".startsWith('round 130 timed out')", timeout=30_000)
        assert shown(page, "device") == ["barn-pi-1"] * 3
        page.click('[data-view-tab="fleet"]')
        page.wait_for_selector("#chart-loss", state="visible")
        assert page.locator("#logs-view").is_hidden()
        page.close()
