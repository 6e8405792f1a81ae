"""Named operator accounts in real headless Chromium (issue 55.6).

The dashboard follows a real mosquitto (dynamic security, the admin's credentials, as a
dashboard with controls runs) with an accounts file of a viewer and an operator. Logged out,
the page asks for a login and shows no fleet. The viewer logs in and reads; its Send stays
disabled, and the same command posted from its page is refused by the server. The operator
logs in and cuts a link from the form: the broker carries the command, and the timeline's line
names the operator (the event log too).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from playwright.sync_api import Browser, Page

from agent.protocol.messages import Control
from agent.protocol.topics import Topics
from dashboard.accounts import Role, save_accounts, with_account
from dashboard.server import DashboardHandle, run_in_thread
from dashboard.settings import DashboardSettings
from simulate.brokers import MosquittoBroker, start_mosquitto
from tests.integration.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "accounts"
ARTIFACTS = Path(os.environ.get("EDGEGROVE_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts"))
CUT = {"action": "cut", "node": 1, "peer": 3}
POST_CUT = ("body => fetch('/api/control', {method: 'POST', headers: {'Content-Type': 'application/json'}, "
            "body: JSON.stringify(body)}).then(r => r.status)")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=7) as started:
        yield started


@pytest.fixture
def served(broker: MosquittoBroker, tmp_path: Path) -> Iterator[DashboardHandle]:
    accounts = tmp_path / "accounts.json"
    save_accounts(accounts, with_account(with_account({}, "ana", Role.OPERATOR, "ana-password"),
                                         "vic", Role.VIEWER, "vic-password"))
    creds = broker.admin_credentials
    settings = DashboardSettings(broker_url=broker.url, job=JOB, username=creds.username,
                                 password=creds.password, port=0, accounts_file=accounts,
                                 event_log=tmp_path / "events.jsonl")
    with run_in_thread(settings) as handle:
        wait_until(lambda: handle.dashboard.broker().connected, what="the dashboard's broker connection")
        yield handle


@pytest.fixture
def controls_heard(broker: MosquittoBroker) -> Iterator[list[Control]]:
    """Every Control on the job's control topic (read with the admin's credentials)."""
    heard: list[Control] = []
    creds = broker.admin_credentials
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="accounts-test-listener")
    client.username_pw_set(creds.username, creds.password)
    client.on_message = lambda _c, _u, m: heard.append(Control.decode(m.payload))
    client.on_connect = lambda c, _u, _f, _r, _p: c.subscribe(Topics(JOB).control, qos=1)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        yield heard
    finally:
        client.loop_stop()
        client.disconnect()


def log_in(page: Page, url: str, name: str, password: str) -> None:
    page.goto(url)
    page.wait_for_selector("#login-card", state="visible", timeout=30_000)
    assert page.locator("#who").is_hidden()
    page.fill("#login-name", name)
    page.fill("#login-password", password)
    page.click("#login-send")
    page.wait_for_function(f"() => document.querySelector('#who-name').textContent.startsWith('{name} ·')",
                           timeout=30_000)
    page.wait_for_function("() => document.querySelector('#ws-pill').dataset.ok === 'true'", timeout=30_000)
    assert page.locator("#login-card").is_hidden()


def fill_cut(page: Page) -> None:
    page.select_option("#control-action", "cut")
    page.fill("#control-node", "1")
    page.fill("#control-peer", "3")


def test_a_viewer_reads_an_operator_acts_and_the_timeline_names_them(
        browser: Browser, served: DashboardHandle, controls_heard: list[Control], tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served.url)
    page.wait_for_selector("#login-card", state="visible", timeout=30_000)
    assert page.evaluate("fetch('/api/fleet').then(r => r.status)") == 401
    page.fill("#login-name", "vic")
    page.fill("#login-password", "not-her-password")
    page.click("#login-send")
    page.wait_for_function("() => document.querySelector('#login-result').textContent.includes('wrong')",
                           timeout=10_000)

    log_in(page, served.url, "vic", "vic-password")
    assert page.inner_text("#who-name") == "vic · viewer"
    assert page.locator("#controls").is_visible() and page.locator("#control-token").is_hidden()
    fill_cut(page)
    assert page.locator("#control-send").is_disabled()
    assert "vic is a viewer" in page.inner_text("#control-hint")
    assert page.evaluate(POST_CUT, CUT) == 403  # the server refuses it too, not only the form
    page.click("#logout")
    page.wait_for_selector("#login-card", state="visible", timeout=30_000)
    assert page.evaluate("fetch('/api/fleet').then(r => r.status)") == 401

    log_in(page, served.url, "ana", "ana-password")
    fill_cut(page)
    assert page.locator("#control-send").is_enabled()
    page.click("#control-send")
    line = page.locator('#events li[data-kind="control"][data-by="ana"]')
    line.wait_for(timeout=30_000)
    assert "sent by operator ana" in line.inner_text()
    wait_until(lambda: bool(controls_heard), what="the operator's command on the broker")
    assert controls_heard == [Control("cut", 1, 3)]  # vic's never reached the broker
    logged = [json.loads(text) for text in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["by"]) for e in logged if e["kind"] == "control"] == [("control", "ana")]
    shot = tmp_path / "dashboard-accounts-operator.png"
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)
    assert errors == []
    page.close()
