"""Incidents and simulator records: faults dated by the fleet's round, opened and healed."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from agent.protocol.messages import Status, Telemetry, View
from dashboard.app import create_app
from dashboard.records import apply_record
from dashboard.settings import DashboardSettings
from dashboard.state import FleetEvent, FleetState, apply_status, apply_telemetry, apply_view, tick

NODES = 7
RUN_FP = "0123456789abcdef"  # the model of a Run's fleet (a view must name one)


class Run:
    """A fleet fed message by message, with the simulator's records in between."""

    def __init__(self) -> None:
        self.state = FleetState(suspect_after=5, hung_after=15)
        self.events: list[FleetEvent] = []
        self.now = 0.0
        self.records: list[dict[str, Any]] = []
        first = View(1, list(range(NODES)), 2, 0, 0, fingerprint=RUN_FP)
        self._take(apply_view(self.state, first, self.now), {"type": "view", **asdict(first)})
        for node in range(NODES):
            self.status(Status(node, "online", 0, 100 + node, incarnation=1000))

    def _take(self, result: tuple[FleetState, tuple[FleetEvent, ...]], record: dict[str, Any]) -> None:
        self.state, events = result
        self.events.extend(events)
        self.records.append({"t": self.now, **record})

    def status(self, msg: Status) -> None:
        msg = replace(msg, fingerprint=RUN_FP)  # the fleet's model, as its view names it
        self._take(apply_status(self.state, msg, self.now), {"type": "status", **asdict(msg)})

    def rounds(self, first: int, last: int, nodes: range | list[int] = range(NODES),
               links: dict[int, dict[str, str]] | None = None,
               notes: dict[tuple[int, int], list[dict[str, Any]]] | None = None) -> None:
        for round_no in range(first, last + 1):
            self.now += 0.2
            for node in nodes:
                msg = Telemetry(node, round_no, 1, "ft", 0.1, loss=1.0, accuracy=0.9,
                                phase_seconds={"total": 0.2 + 0.01 * node},
                                links=(links or {}).get(node, {}), model_hash=f"h{round_no}",
                                events=(notes or {}).get((node, round_no), []))
                self._take(apply_telemetry(self.state, msg, self.now),
                           {"type": "telemetry", **asdict(msg)})
            self.state, events = tick(self.state, self.now)
            self.events.extend(events)

    def view(self, epoch: int, members: list[int], from_round: int) -> None:
        msg = View(epoch, members, 2, 0, from_round, fingerprint=RUN_FP)
        self._take(apply_view(self.state, msg, self.now), {"type": "view", **asdict(msg)})

    def record(self, **record: Any) -> None:
        self._take(apply_record(self.state, record, self.now), record)

    def of_kind(self, kind: str) -> list[FleetEvent]:
        return [e for e in self.events if e.kind == kind]


def crash_and_restart(run: Run) -> None:
    run.rounds(1, 59)
    run.record(type="fault", action="inject", index=1, kind="crash", round=60,
               description="crash node 5", mechanism="sigkill", targets=[5])
    run.status(Status(5, "offline", 0, 105, incarnation=1000))  # the Will: round 0
    run.rounds(60, 63, SURVIVORS)
    run.view(2, SURVIVORS, 64)
    run.rounds(64, 74, SURVIVORS)
    run.record(type="fault", action="heal", index=1, kind="crash", round=75)
    run.status(Status(5, "joining", 50, 205, incarnation=2000))  # resumes from its checkpoint


SURVIVORS = [n for n in range(NODES) if n != 5]


def rejoin_at_90(run: Run) -> None:
    """Node 5 pulls the model while the fleet goes on, and is readmitted from round 90."""
    run.rounds(75, 89, SURVIVORS)
    run.view(3, list(range(NODES)), 90)
    run.rounds(90, 92)


def test_crash_and_rejoin_are_dated_with_the_fleets_round() -> None:
    run = Run()
    crash_and_restart(run)
    [crash] = run.of_kind("crash")
    assert crash.node == 5 and crash.round == 60  # not the Will's round 0
    [rejoin] = run.of_kind("rejoin")
    assert rejoin.round == 75  # not the checkpoint's round 50
    [injected] = run.of_kind("fault_injected")
    assert (injected.node, injected.round) == (5, 60)
    [incident] = run.state.incidents
    assert (incident.kind, incident.targets, incident.source) == ("crash", (5,), "injected")
    # restarted at 75, but not yet back in the fleet: the incident stays active
    assert incident.active and incident.healed_round == 75 and incident.recovered_round is None
    rejoin_at_90(run)
    [incident] = run.state.incidents
    assert (incident.start_round, incident.end_round, incident.recovered_round) == (60, 90, 90)
    assert not incident.active
    assert [e.round for e in run.of_kind("fault_recovered")] == [90]
    assert any("crash node 5" in e for e in incident.evidence)
    assert run.state.nodes[5].restarts == 1


def test_an_injected_link_cut_is_active_until_its_heal_and_explains_the_link_events() -> None:
    run = Run()
    run.rounds(1, 29)
    run.record(type="fault", action="inject", index=0, kind="link", round=30,
               description="link 1-3 cut", mechanism="broker-dynsec", targets=[3, 1])
    cut = {1: {"3": "failed", "4": "ok"}, 3: {"1": "failed", "4": "rerouted"}}
    run.rounds(30, 39, links=cut)
    [incident] = run.state.incidents
    assert incident.active and incident.targets == (1, 3) and incident.start_round == 30
    assert incident.detected_round is not None and 30 <= incident.detected_round <= 31
    run.record(type="fault", action="heal", index=0, kind="link", round=40)
    run.rounds(40, 42, links={1: {"3": "ok"}, 3: {"1": "ok"}})
    [incident] = run.state.incidents  # the link events did not open a second one
    assert not incident.active and incident.end_round == 40
    assert [e.round for e in run.of_kind("fault_healed")] == [40]


def test_a_silent_node_opens_a_detected_incident_that_closes_when_it_reports_again() -> None:
    run = Run()
    run.rounds(1, 10)
    run.rounds(11, 120, [n for n in range(NODES) if n != 6])  # 22 s without node 6
    [hang] = run.state.incidents
    assert (hang.kind, hang.targets, hang.source, hang.active) == ("hang", (6,), "detected", True)
    run.rounds(121, 122)
    [hang] = run.state.incidents
    assert not hang.active and hang.recovered_round == 121  # its first report with the fleet's hash


def test_the_fleet_stopped_at_the_end_of_a_run_is_no_crash() -> None:
    run = Run()
    run.rounds(1, 5)
    run.record(type="run", phase="stopping", replay="edgegrove dashboard --replay runs/x")
    for node in range(NODES):
        run.status(Status(node, "offline", 5, 100 + node, incarnation=1000))
    assert run.of_kind("crash") == []
    assert len(run.of_kind("exit")) == NODES
    assert run.state.run.phase == "ending"
    assert run.state.run.replay_hint == "edgegrove dashboard --replay runs/x"


def test_records_that_make_no_sense_change_nothing() -> None:
    state = FleetState()
    for record in ({"type": "fault", "action": "inject"}, {"type": "status", "node": "x"},
                   {"type": "telemetry", "node": 1}, {"type": "surprise"}, {}):
        assert apply_record(state, record, 1.0) == (state, ())


def test_replay_serves_the_rounds_and_incidents_of_the_run(tmp_path: Path) -> None:
    run = Run()
    crash_and_restart(run)
    rejoin_at_90(run)
    run.record(type="run", phase="stopping", replay=f"edgegrove dashboard --replay {tmp_path}")
    run.record(type="run", phase="end")
    lines = [json.dumps(r) for r in run.records] + ["{truncated"]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"scenario": {"fleet": {"nodes": NODES}}}))
    with TestClient(create_app(DashboardSettings(replay=tmp_path)), base_url="http://127.0.0.1") as client:
        rounds = client.get("/api/rounds").json()
        incidents = client.get("/api/incidents").json()
        fleet = client.get("/api/fleet").json()
        # The round slider: node 5 out at round 65, back at 91.
        at_65 = client.get("/api/fleet", params={"round": 65}).json()
        at_91 = client.get("/api/fleet", params={"round": 91}).json()
        before = client.get("/api/fleet", params={"round": -1})
    node5 = lambda f: next(n for n in f["nodes"] if n["node"] == 5)  # noqa: E731
    assert node5(at_65)["state"] == "offline" and 5 not in at_65["view"]["members"]
    assert [i["active"] for i in at_65["incidents"] if i["kind"] == "crash"] == [True]
    assert node5(at_91)["state"] in ("online", "rejoining") and 5 in at_91["view"]["members"]
    assert at_65["counters"]["latest_round"] == 65
    assert before.status_code == 404
    assert [r["round"] for r in rounds] == sorted(run.state.rounds)
    assert [(i["kind"], i["start_round"], i["end_round"]) for i in incidents] == [
        (i.kind, i.start_round, i.end_round) for i in run.state.incidents]
    assert fleet["run"] == {"phase": "finished", "fleet_size": NODES,
                            "replay_hint": f"edgegrove dashboard --replay {tmp_path}",
                            "replay_of": str(tmp_path)}
    assert fleet["broker"]["url"] is None


FLEET_FP, OTHER_FP = "0123456789abcdef", "ffffffffffffffff"


def test_a_node_with_another_model_is_an_incident_until_it_leaves() -> None:
    state = FleetState()
    view = View(1, [0, 1], 2, 0, 0, fingerprint=FLEET_FP, model="digits-mlp", params=2410)
    state, _ = apply_view(state, view, 0.0)
    for node in (0, 1):
        state, events = apply_status(state, Status(node, "online", fingerprint=FLEET_FP, labels=[3, 4]), 0.1)
        assert "model_mismatch" not in [e.kind for e in events]
    foreign = Status(2, "online", fingerprint=OTHER_FP, model="mnist-cnn", params=1234)
    state, events = apply_status(state, foreign, 0.2)
    mismatch = [e for e in events if e.kind == "model_mismatch"]
    assert len(mismatch) == 1 and mismatch[0].node == 2 and "mnist-cnn (1,234 params" in mismatch[0].detail
    state, events = apply_status(state, foreign, 0.3)  # published again: no second event
    assert "model_mismatch" not in [e.kind for e in events]
    (incident,) = [i for i in state.incidents if i.kind == "model"]
    assert incident.title == "model mismatch: node 2" and incident.active and incident.targets == (2,)
    state, _ = apply_status(state, Status(2, "offline"), 0.4)  # refused, it stopped
    (incident,) = [i for i in state.incidents if i.kind == "model"]
    assert not incident.active


def test_a_view_naming_the_model_finds_the_nodes_that_run_another() -> None:
    state = FleetState()
    state, _ = apply_status(state, Status(0, "online", fingerprint=FLEET_FP), 0.0)
    state, _ = apply_status(state, Status(3, "online", fingerprint=OTHER_FP), 0.0)
    assert not state.incidents  # no view yet: nobody knows the fleet's model
    state, events = apply_view(state, View(1, [0], 2, 0, 0, fingerprint=FLEET_FP), 0.1)
    assert [(e.kind, e.node) for e in events if e.kind == "model_mismatch"] == [("model_mismatch", 3)]
    assert [i.title for i in state.incidents] == ["model mismatch: node 3"]


def test_the_page_gets_each_nodes_model_and_labels() -> None:
    from dashboard.models import BrokerModel, fleet_model

    state = FleetState()
    state, _ = apply_view(state, View(1, [0], 2, 0, 0, fingerprint=FLEET_FP, model="m", params=7), 0.0)
    state, _ = apply_status(state, Status(0, "online", fingerprint=FLEET_FP, model="m", params=7,
                                          labels=[5, 0, 2]), 0.0)
    state, _ = apply_status(state, Status(1, "online", fingerprint=OTHER_FP), 0.0)
    fleet = fleet_model(state, "job", BrokerModel(url=None, connected=True, last_error="", connects=1), False, 0.0)
    nodes = {n.node: n for n in fleet.nodes}
    assert nodes[0].labels == [5, 0, 2] and not nodes[0].model_mismatch and nodes[0].model == "m"
    assert nodes[1].model_mismatch and nodes[1].labels == []
    assert fleet.view is not None and (fleet.view.fingerprint, fleet.view.params) == (FLEET_FP, 7)


def test_a_node_back_with_another_hash_is_not_recovered() -> None:
    run = Run()
    crash_and_restart(run)
    run.rounds(75, 89, SURVIVORS)
    run.view(3, list(range(NODES)), 90)
    run.now += 0.2
    for node in range(NODES):  # node 5 reports a model the others do not have
        msg = Telemetry(node, 90, 1, "ft", 0.1, model_hash="drift" if node == 5 else "h90")
        run.state, _ = apply_telemetry(run.state, msg, run.now)
    [incident] = run.state.incidents
    assert incident.active and incident.recovered_round is None
    run.rounds(91, 91)
    [incident] = run.state.incidents
    assert not incident.active and incident.recovered_round == 91


def test_a_hang_records_its_recovery_round_at_its_rejoin() -> None:
    run = Run()
    run.rounds(1, 99)
    run.record(type="fault", action="inject", index=2, kind="hang", round=100,
               description="node 6 hung", mechanism="sigstop", targets=[6])
    others = [n for n in range(NODES) if n != 6]
    run.rounds(100, 101, others)
    run.view(4, others, 102)
    run.rounds(102, 105, others)
    run.record(type="fault", action="heal", index=2, kind="hang", round=106)
    run.rounds(106, 107, others)
    [hang] = [i for i in run.state.incidents if i.kind == "hang"]
    assert hang.active and hang.healed_round == 106
    run.view(5, list(range(NODES)), 108)
    run.rounds(108, 109)
    [hang] = [i for i in run.state.incidents if i.kind == "hang"]
    assert not hang.active and hang.recovered_round == 108


def test_no_suspicion_of_a_restarted_node_before_it_is_readmitted() -> None:
    run = Run()
    crash_and_restart(run)
    run.rounds(75, 89, SURVIVORS)  # 3 s after the restart, 6 s of silence since round 58
    kinds = [e.kind for e in run.events if e.node == 5]
    assert "suspected" not in kinds and "hung" not in kinds


def test_an_operator_crash_is_the_operators_until_the_node_is_back() -> None:
    run = Run()
    run.rounds(1, 59)
    run.record(type="dashboard_control", action="crash", node=5, peer=None, applied=True,
               outcome="applied: node 5 killed")
    run.status(Status(5, "offline", 0, 105, incarnation=1000))
    run.rounds(60, 63, SURVIVORS)
    run.view(2, SURVIVORS, 64)
    run.rounds(64, 74, SURVIVORS)
    run.record(type="dashboard_control", action="restart", node=5, peer=None, applied=True,
               outcome="applied: node 5 restarted")
    run.status(Status(5, "joining", 50, 205, incarnation=2000))
    [crash] = run.state.incidents
    assert crash.source == "operator" and "operator" in crash.title and crash.active
    assert "seen by the fleet" not in crash.title
    rejoin_at_90(run)
    [crash] = run.state.incidents
    assert not crash.active and crash.recovered_round == 90 and crash.healed_round == 75


def test_a_relayed_frame_draws_the_backup_link_in_use() -> None:
    run = Run()
    run.rounds(1, 29)
    relay = [{"kind": "relay", "peer": 3, "detail": "to 1"}]
    cut = {3: {"1": "failed", "4": "ok"}, 1: {"3": "rerouted"}}
    run.rounds(30, 31, links=cut, notes={(4, 30): relay, (4, 31): relay})
    assert run.state.links[(3, 4)].state == "rerouted" and run.state.links[(3, 4)].kind == "backup"
    assert run.state.links[(1, 3)].state == "failed"
    run.rounds(32, 32, links=cut)  # no relay reported: the detour is no longer in use
    assert run.state.links[(3, 4)].state == "ok"


def test_the_end_of_the_run_leaves_the_last_live_state() -> None:
    run = Run()
    run.rounds(1, 5)
    run.record(type="run", phase="stopping", replay="x")
    for node in range(NODES):
        run.status(Status(node, "offline", 5, 100 + node, incarnation=1000))
        run.status(Status(node, "offline", 0, 100 + node, incarnation=1000))  # sent twice
    assert len(run.of_kind("exit")) == NODES
    assert all(n.status == "online" and n.exited for n in run.state.nodes.values())
    assert [link for link in run.state.links.values() if link.state == "failed"] == []


def test_a_replayed_operator_link_cut_and_loss_are_the_operators_not_the_fleets() -> None:
    run = Run()
    run.rounds(1, 29)
    run.record(type="dashboard_control", action="cut", node=3, peer=1, applied=True,
               outcome="applied: cut link 3->1, by the agents themselves")
    run.record(type="dashboard_control", action="loss", node=4, peer=None, value=0.3, applied=True,
               outcome="applied: loss node 4, by the agents themselves")
    run.rounds(30, 31, links={3: {"1": "failed"}, 1: {"3": "failed"}})
    cut, loss = run.state.incidents
    assert (cut.kind, cut.targets, cut.source, cut.start_round) == ("link", (1, 3), "operator", 30)
    assert "seen by the fleet" not in cut.title and cut.evidence  # the fleet's failure is its evidence
    assert (loss.kind, loss.targets, loss.source) == ("loss", (4,), "operator")
    assert [(a.action, a.round, a.outcome.startswith("applied")) for a in run.state.operator_actions] == [
        ("cut", 30, True), ("loss", 30, True)]
    run.record(type="dashboard_control", action="loss", node=4, peer=None, value=0, applied=True,
               outcome="applied: loss node 4, by the agents themselves")
    assert run.state.operator_actions[-1].undoes and run.state.incidents[1].healed_round == 32


def test_a_liar_left_out_by_its_parent_is_an_incident_naming_the_liar() -> None:
    run = Run()
    run.rounds(1, 9)
    liar = [{"kind": "liar", "peer": 3, "detail": "own part far beyond a member's bound in rounds 8, 9, 10"}]
    run.rounds(10, 11, notes={(1, 10): liar})
    [incident] = run.state.incidents
    assert (incident.kind, incident.targets, incident.source, incident.active) == ("liar", (3,), "detected", True)
    assert incident.title == "lying: node 3 left out by its parent"
