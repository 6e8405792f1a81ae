"""A busy run's whole history on the page (issue 40): about 3,000 events (a node losing 30 %
of its frames NACKs and times out every round, and five link cuts over 450 rounds), served by
`--replay` to real headless Chromium. Every fault is on the timeline and shaded on the charts
(none cut by a ring buffer), the header counts every event and the page has them all; the
page loads, and one redraw takes, as the numbers printed say (asserted under generous bounds
for a loaded host, and the issue's 2 s / 100 ms printed beside them). Past the rounds the
server pushes live (--max-rounds), the page loads the rest of the run's rounds: a replay all at
once, a live run on request; and a node's agent log is shown from the page."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from dashboard.server import run_in_thread
from dashboard.settings import DashboardSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NODES, ROUNDS = 7, 450
CUTS = [(30, 3), (100, 4), (200, 5), (300, 6), (400, 3)]  # (round, child of its parent)
JOB = "busy-run"
FINGERPRINT = "0123456789abcdef"  # the run's model (views must name one)


def usage_cpu(node: int, round_no: int) -> float:
    return 20.0 + 5 * node + round_no % 7


def usage_rss(node: int, round_no: int) -> int:
    return (40 + node) * 1_000_000 + 1000 * round_no


def busy_run(directory: Path) -> int:
    """Writes the run's events.jsonl and config.json; returns its fault injections."""
    records: list[dict[str, Any]] = []
    t = 0.0

    def add(**record: Any) -> None:
        records.append({"t": round(t, 4), **record})

    add(type="view", epoch=1, members=list(range(NODES)), arity=2, coordinator=0, from_round=0,
        fingerprint=FINGERPRINT)  # a view naming no model is refused, in a replay too
    for node in range(NODES):
        add(type="status", node=node, state="online", round=0, pid=100 + node, incarnation=1,
            fingerprint=FINGERPRINT)
    for index, (_at, child) in enumerate(CUTS):
        add(type="fault", action="plan", index=index, kind="link", targets=[(child - 1) // 2, child],
            description=f"link {(child - 1) // 2}<->{child} cut", mechanism="broker-dynsec")
    for round_no in range(ROUNDS):
        t += 0.3
        for index, (at, child) in enumerate(CUTS):
            parent = (child - 1) // 2
            if round_no == at:
                add(type="fault", action="inject", index=index, kind="link", round=at,
                    targets=[parent, child], description=f"link {parent}<->{child} cut",
                    mechanism="broker-dynsec")
            if round_no == at + 10:
                add(type="fault", action="heal", index=index, kind="link", round=at + 10)
        for node in range(NODES):
            lossy = node == 4
            notes = [*({"kind": "nack", "peer": 1, "detail": f"chunk {c}"} for c in (3, 5, 7, 9)),
                     {"kind": "timeout", "peer": 1, "detail": "chunk 0 reduce direct"},
                     {"kind": "pull", "peer": 9, "detail": "2 chunks"},
                     {"kind": "relay", "peer": 3, "detail": "to 1"}] if lossy else []
            add(type="telemetry", node=node, round=round_no, epoch=1, algorithm="ft-tree",
                wall_time=0.3, loss=2.0 / (1 + round_no), local_steps=4, samples=400,
                phase_seconds={"total": 0.25 + 0.01 * node, "compute": 0.05, "allreduce": 0.2 + 0.01 * node},
                bytes_sent=1000, bytes_received=2000 + node, members=NODES, timeouts=int(lossy), nacks=int(lossy),
                cpu_percent=usage_cpu(node, round_no), rss_bytes=usage_rss(node, round_no),
                degraded=lossy and round_no % 2 == 0, missing_chunks=int(lossy),
                model_hash=f"h{round_no}", links={}, events=notes)
    add(type="run", phase="stopping", replay=f"edgegrove dashboard --replay {directory}")
    add(type="run", phase="end")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (directory / "config.json").write_text(json.dumps(
        {"job": JOB, "scenario": {"fleet": {"nodes": NODES, "rounds": ROUNDS}}}))
    return len(CUTS)



def test_a_busy_runs_whole_history_is_on_the_page(browser: Browser, tmp_path: Path) -> None:
    injected = busy_run(tmp_path / "run")
    with run_in_thread(DashboardSettings(replay=tmp_path / "run", port=0)) as served:
        total = served.dashboard.store.state.next_seq - 1
        assert total >= 3000, f"only {total} events: not the busy run the issue means"
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(served.url)  # a first load warms the browser's caches, as an operator's has
        page.wait_for_function("() => Number(document.querySelector('#chart-loss').dataset.points) > 0",
                               timeout=60_000)
        began = time.monotonic()
        page.reload()
        page.wait_for_function(f"() => model.events.length === {total} && "
                               "document.querySelectorAll('#chart-loss .incident-band').length > 0",
                               timeout=60_000)
        load_s = time.monotonic() - began
        # uPlot draws in a microtask after setData: the timer's callback runs after it.
        redraw_ms = min(page.evaluate("async () => { const t = performance.now(); render(); "
                                      "await new Promise(r => setTimeout(r, 0)); "
                                      "return performance.now() - t; }") for _ in range(5))
        print(f"\n{total} events: page loaded in {load_s:.2f} s (issue: < 2 s), one redraw "
              f"{redraw_ms:.0f} ms (issue: < 100 ms)")
        assert page.inner_text("#job") == JOB
        assert page.inner_text("#event-count") == f"{total} events"
        assert page.locator("#events-earlier").is_hidden()
        injections = page.eval_on_selector_all('#events li[data-kind="fault_injected"]',
                                               "els => els.map(e => Number(e.dataset.round))")
        assert sorted(injections) == [at for at, _ in CUTS], injections
        for chart in ("chart-loss", "chart-time"):
            bands = page.eval_on_selector_all(f'#{chart} .incident-band[data-kind="link"]',
                                              "els => els.map(e => Number(e.dataset.start))")
            assert sorted(bands) == [at for at, _ in CUTS], (chart, bands)
        assert len(page.evaluate("model.fleet.incidents")) == injected
        # Periodic averaging's cost, from the newest round: 4 local steps, the slowest agent's
        # sync against its compute, 7,000 bytes sent for 2,800 samples.
        training = page.locator('#counters [data-counter="local steps / sync"]')
        assert training.locator(".value").inner_text() == "4"
        assert training.get_attribute("title") == (f"r{ROUNDS - 1}: sync {0.2 + 0.01 * (NODES - 1):.2f} s vs compute "
                                                   f"0.05 s ({round(100 * (0.2 + 0.01 * (NODES - 1)) / (0.25 + 0.01 * (NODES - 1)))} % of the round) · 3 B sent per sample trained")
        # Generous bounds for a host shared by several fleets: the numbers above are the measure.
        assert load_s < 30 and redraw_ms < 1000
        assert errors == []
        page.close()


def write_agent_logs(run: Path, nodes: range) -> None:
    for node in nodes:
        lines = "".join(f"agent {node}: round {r} done\n" for r in range(ROUNDS))
        (run / "agents").mkdir(exist_ok=True)
        (run / "agents" / f"agent-{node}.log").write_text(lines + f"agent {node}: <b>bye</b>\n")


def test_a_replay_shows_every_round_and_an_agents_log(browser: Browser, tmp_path: Path) -> None:
    run = tmp_path / "run"
    busy_run(run)
    write_agent_logs(run, range(NODES - 1))  # the last node has no log
    settings = DashboardSettings(replay=run, port=0, max_rounds=100)  # 100 pushed, 450 in the run
    with run_in_thread(settings) as served:
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(served.url)
        page.wait_for_function(f"() => model.rounds.size === {ROUNDS}", timeout=60_000)
        assert page.evaluate("() => Math.min(...model.rounds.keys())") == 0
        page.wait_for_selector("#rounds-note", state="hidden", timeout=60_000)
        # The charts plot from round 0, every round of the run.
        for chart in ("chart-loss", "chart-time"):
            page.wait_for_function(f"() => document.querySelector('#{chart}').dataset.xMin === '0'"
                                   f" && document.querySelector('#{chart}').dataset.points === '{ROUNDS}'",
                                   timeout=60_000)

        page.click('#nodes tr[data-node="4"] button.log-open')
        page.wait_for_function("() => document.querySelector('#log-meta').dataset.state === 'shown'"
                               " && document.querySelector('#log-tail').dataset.node === '4'",
                               timeout=60_000)
        text = page.inner_text("#log-tail")
        assert text.splitlines()[-1] == "agent 4: <b>bye</b>"  # shown as text, not markup
        assert "agent 4: round 449 done" in text and "agent 4: round 0 done" not in text
        assert "agents/agent-4.log" in page.inner_text("#log-meta")
        assert page.locator("#log-tail b").count() == 0
        page.select_option("#log-node", str(NODES - 1))
        page.click("#log-show")
        page.wait_for_function("() => document.querySelector('#log-meta').dataset.state === 'missing'",
                               timeout=60_000)
        assert "no log" in page.inner_text("#log-meta") and page.locator("#log-tail").is_hidden()
        assert errors == []
        page.close()


def test_a_live_page_loads_earlier_rounds_on_request(browser: Browser, tmp_path: Path) -> None:
    rounds, pushed = 300, 50
    with run_in_thread(DashboardSettings(port=0, max_rounds=pushed)) as served:
        for round_no in range(rounds):
            served.dashboard.feed({"type": "telemetry", "node": 0, "round": round_no, "epoch": 1,
                                   "algorithm": "ft-tree", "wall_time": 0.1, "loss": 1 / (1 + round_no),
                                   "phase_seconds": {"total": 0.1}})
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(served.url)
        page.wait_for_function(f"() => model.fleet && model.fleet.counters.latest_round === {rounds - 1}"
                               f" && model.rounds.size === {pushed}", timeout=60_000)
        note = page.locator("#rounds-note")
        note.wait_for(state="visible", timeout=60_000)
        assert f"rounds {rounds - pushed}–{rounds - 1}" in note.inner_text()
        assert f"({rounds - pushed} more)" in page.inner_text("#rounds-earlier")
        page.click("#rounds-earlier")
        page.wait_for_function(f"() => model.rounds.size === {rounds}", timeout=60_000)
        note.wait_for(state="hidden", timeout=60_000)
        page.close()


def chart_range(page: Page, chart: str) -> tuple[int, int]:
    lo, hi = page.evaluate(f"() => [document.querySelector('#{chart}').dataset.xMin, "
                           f"document.querySelector('#{chart}').dataset.xMax]")
    return int(lo), int(hi)


def test_charts_zoom_together_share_a_cursor_and_export_csv(browser: Browser, tmp_path: Path) -> None:
    busy_run(tmp_path / "run")
    with run_in_thread(DashboardSettings(replay=tmp_path / "run", port=0)) as served:
        page = browser.new_page(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        foreign: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(served.url) else foreign.append(r.url))
        page.goto(served.url)
        page.wait_for_function(f"() => document.querySelector('#chart-time').dataset.points === '{ROUNDS}'",
                               timeout=60_000)
        assert page.evaluate("() => typeof uPlot") == "function"  # the vendored library, no CDN
        assert foreign == []
        whole = chart_range(page, "chart-loss")
        assert whole == (0, ROUNDS)
        # Drag across the middle of the loss chart: every chart shows that range of rounds.
        # In view first: the mouse acts in the viewport, and the page may be taller than it.
        page.locator("#chart-loss .u-over").scroll_into_view_if_needed()
        over = page.locator("#chart-loss .u-over").bounding_box()
        assert over is not None
        y = over["y"] + over["height"] / 2
        page.mouse.move(over["x"] + over["width"] * 0.3, y)
        page.mouse.down()
        page.mouse.move(over["x"] + over["width"] * 0.45, y, steps=5)
        page.mouse.move(over["x"] + over["width"] * 0.6, y, steps=5)
        page.mouse.up()
        page.wait_for_function("() => document.querySelector('#chart-zoom').dataset.zoomed === 'true'",
                               timeout=60_000)
        lo, hi = chart_range(page, "chart-loss")
        assert 0 < lo < hi < ROUNDS and hi - lo < ROUNDS * 0.5, (lo, hi)
        page.wait_for_function(f"() => ['chart-accuracy', 'chart-time'].every(c => "
                               f"document.querySelector('#' + c).dataset.xMin === '{lo}' && "
                               f"document.querySelector('#' + c).dataset.xMax === '{hi}')", timeout=60_000)
        # Only the fault windows in that range are drawn.
        bands = page.eval_on_selector_all('#chart-time .incident-band', "els => els.map(e => Number(e.dataset.start))")
        assert sorted(bands) == [at for at, _ in CUTS if at <= hi and at + 10 >= lo], (bands, lo, hi)
        # One cursor on every chart: pointing at the loss chart moves the others' to that round.
        page.mouse.move(over["x"] + over["width"] * 0.5, y)
        page.mouse.move(over["x"] + over["width"] * 0.5 + 2, y)
        page.wait_for_function("() => { const r = document.querySelector('#chart-loss').dataset.cursorRound;"
                               " return r !== '' && r !== undefined && ['chart-accuracy', 'chart-time'].every("
                               "c => document.querySelector('#' + c).dataset.cursorRound === r); }",
                               timeout=60_000)
        pointed = int(page.get_attribute("#chart-loss", "data-cursor-round") or -1)
        assert lo <= pointed <= hi
        assert f"round {pointed} " in page.inner_text("#chart-tip")
        # CSV of the rounds in the range: a header and one row per round.
        with page.expect_download() as download:
            page.click("#export-csv")
        rows = Path(download.value.path()).read_text().splitlines()
        assert rows[0].startswith("round,epoch,loss,accuracy,round_seconds_median")
        assert [int(r.split(",")[0]) for r in rows[1:]] == list(range(lo, hi + 1))
        assert download.value.suggested_filename == f"{JOB}-rounds-{lo}-{hi}.csv"
        first = rows[1].split(",")
        assert float(first[2]) == pytest.approx(2.0 / (1 + lo))  # the round's loss, as recorded
        page.dblclick("#chart-time .u-over")  # uPlot's zoom-out, on any chart, for all of them
        page.wait_for_function("() => document.querySelector('#chart-zoom').dataset.zoomed === 'false'",
                               timeout=60_000)
        page.mouse.move(over["x"] + over["width"] * 0.2, y)
        page.mouse.down()
        page.mouse.move(over["x"] + over["width"] * 0.4, y, steps=5)
        page.mouse.up()
        page.wait_for_function("() => document.querySelector('#chart-zoom').dataset.zoomed === 'true'",
                               timeout=60_000)
        page.click("#zoom-reset")
        page.wait_for_function(f"() => ['chart-loss', 'chart-accuracy', 'chart-time'].every(c => "
                               f"document.querySelector('#' + c).dataset.xMax === '{ROUNDS}' && "
                               f"document.querySelector('#' + c).dataset.xMin === '0')", timeout=60_000)
        assert errors == [] and foreign == []
        page.close()


def recorded_telemetry(run: Path, node: int) -> dict[int, dict[str, Any]]:
    """The node's telemetry records of the run, by round: what its series must show."""
    records = (json.loads(line) for line in (run / "events.jsonl").read_text().splitlines())
    return {r["round"]: r for r in records if r["type"] == "telemetry" and r["node"] == node}


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]  # the PNG signature
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_picked_nodes_add_their_own_series_and_charts_export_as_png(browser: Browser, tmp_path: Path) -> None:
    run = tmp_path / "run"
    busy_run(run)
    with run_in_thread(DashboardSettings(replay=run, port=0)) as served:
        page = browser.new_page(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(served.url)
        page.wait_for_function(f"() => document.querySelector('#chart-time').dataset.points === '{ROUNDS}'",
                               timeout=60_000)
        assert page.locator("#node-charts").is_hidden()  # no node picked: the fleet's charts only
        assert page.evaluate("() => ui.charts['chart-time'].plot.series.length") == 2
        picked = [2, 4]
        for node in picked:
            page.click(f'#node-pick button[data-series-node="{node}"]')
        page.wait_for_function(
            f"() => ['chart-time', 'chart-cpu', 'chart-rss', 'chart-bytes'].every(c => "
            f"document.querySelector('#' + c).dataset.nodes === '2,4') && "
            f"Number(document.querySelector('#chart-cpu').dataset.points) === {2 * ROUNDS} && "
            f"Number(document.querySelector('#chart-bytes').dataset.points) === {4 * ROUNDS}", timeout=60_000)
        assert page.locator("#node-charts").is_visible()
        assert page.get_attribute('#node-pick button[data-series-node="4"]', "aria-pressed") == "true"
        data = page.evaluate("() => Object.fromEntries(['chart-time', 'chart-cpu', 'chart-rss', 'chart-bytes']"
                             ".map(c => [c, {data: ui.charts[c].plot.data, scale: Number(document"
                             ".querySelector('#' + c).dataset.scale || 1), labels: ui.charts[c].plot"
                             ".series.slice(1).map(s => s.label)}]))")
        assert data["chart-time"]["labels"] == ["median agent", "node 2", "node 4"]
        assert data["chart-bytes"]["labels"] == ["node 2 sent", "node 2 received", "node 4 sent", "node 4 received"]
        assert data["chart-rss"]["scale"] == 1e6 and data["chart-bytes"]["scale"] == 1e3
        for k, node in enumerate(picked):
            told = recorded_telemetry(run, node)
            xs = data["chart-cpu"]["data"][0]
            assert xs == list(range(ROUNDS))
            assert data["chart-time"]["data"][2 + k] == pytest.approx(
                [told[x]["phase_seconds"]["total"] for x in xs])
            assert data["chart-cpu"]["data"][1 + k] == pytest.approx([told[x]["cpu_percent"] for x in xs])
            assert data["chart-rss"]["data"][1 + k] == pytest.approx([told[x]["rss_bytes"] / 1e6 for x in xs])
            sent, received = data["chart-bytes"]["data"][1 + 2 * k: 3 + 2 * k]
            assert sent == pytest.approx([told[x]["bytes_sent"] / 1e3 for x in xs])
            assert received == pytest.approx([told[x]["bytes_received"] / 1e3 for x in xs])
        # The tip names the picked nodes' numbers of the round under the pointer.
        plot = page.locator("#chart-cpu .u-over")
        plot.scroll_into_view_if_needed()
        box = plot.bounding_box()
        assert box is not None
        deadline = time.monotonic() + 60
        nudge = 0
        while page.locator("#chart-tip").is_hidden():  # moved again until the page has laid out
            plot.hover(position={"x": box["width"] * 0.5 + nudge, "y": box["height"] / 2})
            assert time.monotonic() < deadline, "no tip over the CPU chart"
            nudge = 2 - nudge
            page.wait_for_timeout(100)
        pointed = int(page.get_attribute("#chart-cpu", "data-cursor-round") or -1)
        tip = page.inner_text("#chart-tip")
        assert "node 4: " in tip and f"CPU {usage_cpu(4, pointed):.0f} %" in tip, tip
        # PNG export: a real PNG image of the chart, larger than its canvas (title, legend).
        for chart in ("chart-time", "chart-cpu"):
            with page.expect_download() as download:
                page.click(f'button[data-png="{chart}"]')
            assert download.value.suggested_filename == f"{JOB}-{chart.removeprefix('chart-')}.png"
            image = Path(download.value.path()).read_bytes()
            width, height = png_size(image)
            canvas_w, canvas_h = page.evaluate(f"() => [ui.charts['{chart}'].plot.ctx.canvas.width, "
                                               f"ui.charts['{chart}'].plot.ctx.canvas.height]")
            assert width > canvas_w >= 200 and height > canvas_h >= 150, (width, height, canvas_w, canvas_h)
            assert len(image) > 5000, len(image)
            from PIL import Image  # the image decodes, and the picked node's colour is drawn in it

            with Image.open(Path(download.value.path())) as decoded:
                decoded.verify()
            with Image.open(Path(download.value.path())) as decoded:
                colours = {c for _, c in decoded.convert("RGB").getcolors(maxcolors=1 << 20) or []}
            assert (0x9c, 0x36, 0xb5) in colours or (0x0b, 0x72, 0x85) in colours, "node 2/4 series not drawn"
            assert len(colours) > 20
        # Unpicking a node takes its series away.
        page.click('#node-pick button[data-series-node="4"]')
        page.wait_for_function("() => document.querySelector('#chart-cpu').dataset.nodes === '2'"
                               " && ui.charts['chart-time'].plot.series.length === 3", timeout=60_000)
        page.click('#node-pick button[data-series-node="2"]')
        page.wait_for_selector("#node-charts", state="hidden", timeout=60_000)
        assert errors == []
        page.close()


def test_a_live_page_keeps_a_picked_nodes_series_up_to_date(browser: Browser, tmp_path: Path) -> None:
    def report(round_no: int) -> dict[str, Any]:
        return {"type": "telemetry", "node": 1, "round": round_no, "epoch": 1, "algorithm": "ft-tree",
                "wall_time": 0.1, "loss": 1 / (1 + round_no), "phase_seconds": {"total": 0.2},
                "cpu_percent": usage_cpu(1, round_no), "rss_bytes": usage_rss(1, round_no)}

    with run_in_thread(DashboardSettings(port=0)) as served:
        for round_no in range(20):
            served.dashboard.feed(report(round_no))
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(served.url)
        page.wait_for_function("() => model.fleet && model.fleet.counters.latest_round === 19", timeout=60_000)
        page.click('#node-pick button[data-series-node="1"]')
        page.wait_for_function("() => document.querySelector('#chart-cpu').dataset.points === '20'", timeout=60_000)
        for round_no in range(20, 50):  # the fleet moves on: the picked node's new rounds follow
            served.dashboard.feed(report(round_no))
        page.wait_for_function("() => document.querySelector('#chart-cpu').dataset.points === '50'", timeout=60_000)
        cpu = page.evaluate("() => ui.charts['chart-cpu'].plot.data[1]")
        assert cpu == pytest.approx([usage_cpu(1, r) for r in range(50)])
        assert errors == []
        page.close()
