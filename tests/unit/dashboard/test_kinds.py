"""The dashboard's kinds: closed sets, one source for the page, nothing spelled twice."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from agent.jobs.states import DeviceState, ExecState
from agent.protocol.messages import Telemetry
from agent.protocol.notes import NoteKind
from dashboard.app import create_app
from dashboard.directory import JobState
from dashboard.kinds import (
    BADGES,
    CHATTY,
    FAULT_COLOURS,
    FILTERS,
    EventKind,
    IncidentKind,
    page_kinds,
    page_module,
)
from dashboard.settings import DashboardSettings
from dashboard.state import FleetState, apply_telemetry
from simulate.scenario import FAULT_KINDS

STATIC = Path(__file__).resolve().parents[3] / "dashboard" / "static"
SCRIPTS = ("app.js", "charts.js", "views.js")
KIND_VALUES = {k.value for enum in (NoteKind, EventKind, IncidentKind) for k in enum}


def _script(name: str) -> str:
    """A page script without its comments (a comment may name a kind)."""
    text = (STATIC / name).read_text()
    return re.sub(r"//[^\n]*", "", text)


def test_the_dashboards_events_are_not_the_agents_notes() -> None:
    """One value, one meaning on the wire: a dashboard event never reads as an agent's note."""
    assert not {k.value for k in EventKind} & {k.value for k in NoteKind}


def test_every_fault_the_simulator_injects_is_an_incident_kind_with_a_colour() -> None:
    assert set(FAULT_KINDS) <= {k.value for k in IncidentKind}
    assert set(FAULT_COLOURS) == set(IncidentKind)


def test_the_page_module_is_the_enums_and_tables() -> None:
    text = page_module()
    assert text.splitlines()[1:3] == ['"use strict";', "const KINDS = Object.freeze({"]
    kinds = json.loads(text[text.index("{"): text.rindex("}") + 1])
    assert kinds == json.loads(json.dumps(page_kinds()))
    assert kinds["note"]["LINK_DEAD"] == "link_dead" and kinds["event"]["VIEW_CHANGE"] == "view_change"
    assert kinds["incident"]["BROKER_RESTART"] == "broker-restart"
    assert set(kinds["filters"]["links"]) == set(FILTERS["links"]) and set(kinds["chatty"]) == set(CHATTY)
    assert kinds["badge"]["crash"] == BADGES[EventKind.CRASH] == "failed"


def test_the_app_serves_the_kinds_before_the_pages_scripts() -> None:
    with TestClient(create_app(DashboardSettings(job="k")), base_url="http://127.0.0.1") as client:
        served = client.get("/kinds.js")
        page = client.get("/").text
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript")
    assert served.text == page_module()
    assert page.index("/kinds.js") < page.index("/static/charts.js") < page.index("/static/app.js")


def test_the_pages_scripts_name_only_kinds_that_exist() -> None:
    kinds = page_kinds()
    tables = {"NOTE": kinds["note"], "EVENT": kinds["event"], "INCIDENT": kinds["incident"]}
    named = [(m[0], m[1]) for name in SCRIPTS for m in re.findall(r"\b(NOTE|EVENT|INCIDENT)\.([A-Za-z_]+)", _script(name))]
    assert named, "the scripts name kinds through NOTE, EVENT and INCIDENT"
    missing = [f"{table}.{member}" for table, member in named if member not in tables[table]]
    assert missing == []
    fields = {f for name in SCRIPTS for f in re.findall(r"\bKINDS\.([A-Za-z_]+)", _script(name))}
    assert fields and fields <= set(kinds)


def test_the_pages_scripts_spell_no_kind() -> None:
    """Kinds whose text is no plain word (view_change, broker-restart) never appear in the
    scripts, quoted or as a key: the page takes them from KINDS. (A word such as "crash" is
    also a control's action and a node's state, so only these can be told apart; after a dot
    it is a field, such as a node's ``model_mismatch``.)"""
    spelled = {name: sorted({t for t in re.findall(r"(?<![.\w])[a-z]+(?:[_-][a-z]+)+", _script(name))
                             if t in KIND_VALUES})
               for name in SCRIPTS}
    assert spelled == {name: [] for name in SCRIPTS}


def test_an_agent_speaks_only_notes() -> None:
    """A note of a kind no agent notes (here the dashboard's own "crash") is shown as unknown,
    with its text: an agent cannot forge the dashboard's events or open an incident."""
    msg = Telemetry(2, 1, 1, "ft", 0.1, events=[{"kind": "crash", "detail": "says node 2"},
                                                 {"kind": "fault_injected", "detail": "loss 0"}])
    state, events = apply_telemetry(FleetState(), msg, 0.0)
    assert [(e.kind, e.detail) for e in events] == [
        (EventKind.UNKNOWN, "crash: says node 2"), (EventKind.CONTROL_APPLIED, "loss 0")]
    assert state.incidents == ()


def test_every_device_execution_and_job_state_has_a_badge_the_page_knows() -> None:
    kinds = page_kinds()
    colours = set(re.findall(r"\b([a-z]+): \"#", _script("app.js").split("};")[0]))
    for table, states in (("deviceBadge", DeviceState), ("execBadge", ExecState), ("jobBadge", JobState)):
        badges = kinds[table]
        assert isinstance(badges, dict) and set(badges) == {s.value for s in states}, table
        assert set(badges.values()) <= colours, (table, set(badges.values()) - colours)
