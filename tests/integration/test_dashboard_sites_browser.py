"""The dashboard page in real headless Chromium over bridged sites: real mosquittos (a core and
one broker per site, each site's bridge dialling the core through its uplink proxy, as
`edgegrove simulate --sites` runs them) and a demo fleet whose nodes sit at their site's broker.

The page must group the nodes by site (a box per site in the tree, a group per site in the node
table) and show each bridge's state and bytes; cutting one site's uplink must turn its bridge
down on the page (the core's bridge notification) and healing it must bring it back up, with
bytes moving again. The uplinks' bytes reach the dashboard as the simulator hands them over:
its event log's ``uplinks`` records, fed to the dashboard by the log's listener.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from dashboard.demo import DemoFleet, NodeCredentials
from dashboard.server import DashboardHandle, run_in_thread
from dashboard.settings import DashboardSettings
from simulate.site_brokers import SiteBrokers, start_sites
from simulate.telemetry import EventLog
from tests.integration.test_dashboard_browser import (
    ROUND_SHOWN,
    save_screenshot,
    wait_within_rounds,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "dashsites"
NODES = 6
SITES = {0: "s0", 1: "s0", 2: "s1", 3: "s1", 4: "s2", 5: "s2"}  # make-sites: blocks by id
CUT = "s1"
SAMPLE_S = 0.5  # how often the stand-in simulator logs the uplinks (it logs per round and 1 s)
BRIDGE_ROUNDS = 10  # a bridge's change shown within this many rounds (and FLOOR_S)


class UplinkSampler:
    """The simulator's part: log the uplinks' bytes and cuts, the log feeding the dashboard."""

    def __init__(self, brokers: SiteBrokers, handle: DashboardHandle, log_path: Path) -> None:
        self.brokers = brokers
        self.log = EventLog(log_path)
        self.log.listeners.append(handle.feed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="uplink-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.log.add("uplinks", **self.brokers.uplinks_record())

    def __enter__(self) -> UplinkSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.log.close()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[SiteBrokers]:
    with start_sites(tmp_path / "brokers", job=JOB, nodes=NODES, sites=3) as running:
        assert {n: running.site_of(n) for n in range(NODES)} == SITES
        yield running


@pytest.fixture
def served(brokers: SiteBrokers, tmp_path: Path) -> Iterator[DashboardHandle]:
    creds = brokers.dashboard_credentials
    settings = DashboardSettings(broker_url=brokers.core.url, job=JOB, username=creds.username,
                                 password=creds.password, port=0, fleet_size=NODES,
                                 event_log=tmp_path / "dashboard-events.jsonl")
    with run_in_thread(settings) as handle:
        yield handle


@pytest.fixture
def fleet(brokers: SiteBrokers) -> Iterator[DemoFleet]:
    logins = {n: brokers.credentials_for(n) for n in range(NODES)}
    creds = {n: NodeCredentials(c.username, c.password, c.client_id) for n, c in logins.items()}
    demo = DemoFleet(brokers.core.url, JOB, NODES, credentials=creds, round_window=0.3, sites=SITES,
                     broker_urls={n: brokers.url_for(n) for n in range(NODES)})
    demo.start_background()
    yield demo
    demo.stop()



def bridge_shown(site: str, state: str) -> str:
    """The site's bridge in ``state`` in the sites table, the tree's site box and the node
    table's site row alike."""
    return f"""() => ['#sites tr', '#tree .site', '#nodes tr.site-row'].every(sel =>
        document.querySelector(`${{sel}}[data-site="{site}"]`)?.dataset.bridge === '{state}')"""


def said_by(page: Page, site: str) -> str | None:
    """Who said the bridge's state: the broker's notification, or the simulator's uplink."""
    return page.get_attribute(f'#sites tr[data-site="{site}"]', "data-source")


def bytes_up(page: Page, site: str) -> int:
    return int(page.get_attribute(f'#sites tr[data-site="{site}"]', "data-bytes-up") or 0)


def nodes_inside_their_site_box(page: Page) -> dict[str, str]:
    """Each tree node -> the site whose box contains it on screen ("" if none)."""
    return page.evaluate("""() => {
        const boxes = [...document.querySelectorAll('#tree .site')].map(g => [g.dataset.site,
            g.querySelector('rect').getBoundingClientRect()]);
        return Object.fromEntries([...document.querySelectorAll('#tree .node')].map(n => {
            const c = n.querySelector('circle.body').getBoundingClientRect();
            const x = c.left + c.width / 2, y = c.top + c.height / 2;
            const box = boxes.find(([, r]) => x > r.left && x < r.right && y > r.top && y < r.bottom);
            return [n.dataset.node, box ? box[0] : ''];
        }));
    }""")


def test_page_groups_nodes_by_site_and_shows_a_bridge_down_and_up(
    brokers: SiteBrokers, served: DashboardHandle, fleet: DemoFleet, browser: Browser, tmp_path: Path,
) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1300})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    with UplinkSampler(brokers, served, tmp_path / "events.jsonl"):
        try:
            page.goto(served.url)
            page.wait_for_function(f"""() => {{
                const nodes = [...document.querySelectorAll('#tree .node')];
                return nodes.length === {NODES} && nodes.every(n => n.dataset.state === 'online')
                    && {ROUND_SHOWN} >= 2;
            }}""", timeout=60_000)
            # Grouped by site: a box per site around its nodes, a group per site in the table.
            assert nodes_inside_their_site_box(page) == {str(n): s for n, s in SITES.items()}
            rows = page.eval_on_selector_all(
                "#nodes tbody tr", "els => els.map(e => e.dataset.node ?? `site ${e.dataset.site}`)")
            assert rows == ["site s0", "0", "1", "site s1", "2", "3", "site s2", "4", "5"]
            for site in ("s0", "s1", "s2"):
                wait_within_rounds(page, bridge_shown(site, "up"), BRIDGE_ROUNDS, f"bridge {site} up")
            # Bytes each way and a rate, from the uplinks' own counters.
            wait_within_rounds(page, f"""() => {{
                const row = document.querySelector('#sites tr[data-site="{CUT}"]');
                return Number(row.dataset.bytesUp) > 0 && Number(row.dataset.bytesDown) > 0
                    && row.cells[7].textContent.endsWith('/s');
            }}""", BRIDGE_ROUNDS, "bytes and rates of the uplink")

            brokers.cut_bridge(CUT)
            wait_within_rounds(page, bridge_shown(CUT, "down"), BRIDGE_ROUNDS, f"bridge {CUT} down")
            assert page.get_attribute(f'#sites tr[data-site="{CUT}"] td:nth-child(5)', "class") == "wide"
            assert page.text_content(f'#sites tr[data-site="{CUT}"] td:nth-child(5)') == "1"  # downs
            assert said_by(page, CUT) == "broker"  # the core's bridge notification, not only the cut
            for site in ("s0", "s2"):
                assert page.evaluate(f"({bridge_shown(site, 'up')})()"), f"{site} shown down too"
            page.click('#event-filters button[data-filter="faults"]')
            wait_within_rounds(page, f"""() => [...document.querySelectorAll('#events li')].some(li =>
                li.dataset.kind === 'bridge_down' && li.textContent.includes('site {CUT}'))""",
                               BRIDGE_ROUNDS, "the bridge_down event in the timeline")
            save_screenshot(page, tmp_path, "sites-cut")
            at_cut = bytes_up(page, CUT)

            brokers.heal_bridge(CUT)
            wait_within_rounds(page, bridge_shown(CUT, "up"), BRIDGE_ROUNDS, f"bridge {CUT} up again")
            assert said_by(page, CUT) == "broker"  # the bridge redialled, not only the uplink back
            wait_within_rounds(page, f"() => Number(document.querySelector('#sites tr[data-site=\"{CUT}\"]')"
                                     f".dataset.bytesUp) > {at_cut}", BRIDGE_ROUNDS, "bytes over the healed uplink")
            wait_within_rounds(page, """() => [...document.querySelectorAll('#events li')].some(li =>
                li.dataset.kind === 'bridge_up')""", BRIDGE_ROUNDS, "the bridge_up event in the timeline")
            shot = save_screenshot(page, tmp_path, "sites")
            assert shot.stat().st_size > 10_000
            assert errors == []
        except Exception:
            save_screenshot(page, tmp_path, "sites-failed")
            raise
        finally:
            page.close()
