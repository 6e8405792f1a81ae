"""The pure FleetState reducer, replaying recorded message sequences (see make_recordings.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from agent.protocol.membership import view_tree
from agent.protocol.messages import Status, Telemetry, View
from agent.protocol.topics import Topics
from dashboard.state import (
    FleetEvent,
    FleetState,
    apply_malformed,
    apply_status,
    apply_telemetry,
    apply_view,
    events_since,
    rejected_frames,
    rounds_since,
    tick,
)

RECORDINGS = Path(__file__).resolve().parent / "recordings"
TOPICS = Topics("rec")


def replay(name: str, state: FleetState | None = None) -> Iterator[tuple[dict, FleetState, tuple[FleetEvent, ...]]]:
    """Yields (line, state after it, events it caused) for every recorded message."""
    state = state or FleetState()
    for text in (RECORDINGS / name).read_text().splitlines():
        line = json.loads(text)
        payload = json.dumps(line["payload"]).encode()
        topic, now = line["topic"], line["t"]
        if topic == TOPICS.view:
            state, events = apply_view(state, View.decode(payload), now)
        elif TOPICS.parse_status(topic) is not None:
            state, events = apply_status(state, Status.decode(payload), now)
        else:
            state, events = apply_telemetry(state, Telemetry.decode(payload), now)
        yield line, state, events


def final(name: str, state: FleetState | None = None) -> tuple[FleetState, list[FleetEvent]]:
    events: list[FleetEvent] = []
    last = state or FleetState()
    for _line, after, new in replay(name, state):
        events.extend(new)
        last = after
    return last, events


def kinds(events: list[FleetEvent]) -> list[str]:
    return [e.kind for e in events]


# ---------------------------------------------------------------- crash


def test_crash_marks_node_offline_its_links_failed_then_view_drops_it() -> None:
    before_view: FleetState | None = None
    for line, state, _events in replay("crash.jsonl"):
        if line["topic"] == TOPICS.view and line["payload"]["epoch"] == 2:
            break
        before_view = state
    assert before_view is not None
    assert before_view.nodes[4].display == "offline"
    assert before_view.links[(1, 4)].state == "failed"
    assert before_view.links[(3, 4)].state == "failed"  # the backup link to a dead node too
    assert before_view.links[(1, 3)].state == "ok"

    state, events = final("crash.jsonl")
    crash = [e for e in events if e.kind == "crash"]
    assert [(e.node, e.kind) for e in crash] == [(4, "crash")]
    # its links fail with it, without one more timeline line per link
    assert not [e for e in events if e.kind == "link_failed" and 4 in (e.node, e.peer)]
    view_change = [e for e in events if e.kind == "view_change"]
    assert "left [4]" in view_change[-1].detail
    assert (1, 4) not in state.links  # no longer a link of the tree
    assert state.nodes[4].display == "offline"
    assert state.view is not None and state.view.epoch == 2


def test_crash_round_is_degraded_once_and_counted() -> None:
    state, events = final("crash.jsonl")
    assert kinds(events).count("degraded") == 1
    assert state.counters.degraded_rounds == 1
    assert state.rounds[6].degraded and state.rounds[6].degraded_nodes == 1
    assert state.rounds[6].round_seconds == pytest.approx(1.62)
    assert rejected_frames(state) == {"stale_round": 2}  # totals, not summed per round
    assert state.counters.timeouts == 3
    assert {"timeout", "link_dead", "degraded"} <= set(state.rounds[6].event_kinds)
    assert state.counters.rounds == 8


# ---------------------------------------------------------------- reroute


def test_reroute_turns_link_rerouted_and_back_to_ok() -> None:
    link_states: list[tuple[int, str]] = []
    for line, state, _events in replay("reroute.jsonl"):
        if (1, 3) in state.links and line["topic"].endswith("telemetry/6"):
            link_states.append((line["payload"]["round"], state.links[(1, 3)].state))
    assert dict(link_states) == {1: "ok", 2: "ok", 3: "ok", 4: "rerouted", 5: "rerouted",
                                 6: "rerouted", 7: "ok", 8: "ok"}

    state, events = final("reroute.jsonl")
    rerouted = [e for e in events if e.kind == "link_rerouted"]
    healed = [e for e in events if e.kind == "link_ok"]
    assert [(e.node, e.peer, e.round) for e in rerouted] == [(1, 3, 4)]
    assert [(e.node, e.peer, e.round) for e in healed] == [(1, 3, 7)]
    assert [e.detail for e in events if e.kind == "reroute"] == ["via 4"] * 3
    assert state.counters.reroutes == 3
    assert state.nodes[3].reroutes == 3
    assert all(n.display == "online" for n in state.nodes.values())


def test_rounds_summarise_every_report() -> None:
    state, _ = final("reroute.jsonl")
    r4 = state.rounds[4]
    assert r4.reports == 7
    assert r4.round_seconds == pytest.approx(0.55)
    assert r4.loss is not None and r4.loss == pytest.approx(2.3 * 2.718281828 ** -1 + 0.05, abs=1e-3)
    assert r4.accuracy == pytest.approx(0.92)
    assert state.rounds[3].accuracy is None  # not an evaluation round
    assert [r.round for r in rounds_since(state, 6)] == [7, 8]


# ---------------------------------------------------------------- rejoin


def test_rejoin_goes_offline_rejoining_online() -> None:
    displays: list[str] = []
    for line, state, _events in replay("rejoin.jsonl"):
        if line["topic"].endswith("status/5"):
            displays.append(state.nodes[5].display)
    assert displays == ["online", "offline", "rejoining", "online"]

    state, events = final("rejoin.jsonl")
    lifecycle = [e for e in events if e.node == 5 and e.kind in ("crash", "offline", "rejoin")]
    # the dashboard's own rejoin (from the status), then the agent's (from its telemetry)
    assert kinds(lifecycle) == ["crash", "rejoin", "rejoin"]
    # dated with the fleet's round when the status came (the status itself says 5: the round
    # its checkpoint resumes from), not with a round the fleet left behind
    assert [e.round for e in lifecycle[1:]] == [6, 7]
    assert "resumes from round 5" in next(e.detail for e in events if e.kind == "rejoin")
    assert state.nodes[5].restarts == 1
    assert {"resync", "rejoin"} <= set(state.rounds[7].event_kinds)
    assert state.nodes[5].incarnation == 2
    assert state.view is not None and 5 in state.view.members
    assert state.links[(2, 5)].state == "ok"


# ---------------------------------------------------------------- silence: suspected, hung


def _fleet_with_rounds(rounds: int, silent_from: int) -> FleetState:
    """7 nodes report rounds 1..rounds, one a second; node 6 stops after silent_from."""
    state, _ = apply_view(FleetState(suspect_after=5, hung_after=15), View(1, list(range(7)), 2, 0, 0), 0.0)
    for n in range(7):
        state, _ = apply_status(state, Status(n, "online"), 0.0)
    for r in range(1, rounds + 1):
        for n in range(7):
            if n == 6 and r > silent_from:
                continue
            state, _ = apply_telemetry(state, Telemetry(n, r, 1, "ft-tree", 0.1), float(r))
    return state


def test_silent_node_becomes_suspected_then_hung_then_recovers() -> None:
    state = _fleet_with_rounds(rounds=10, silent_from=4)  # node 6 last seen at t=4
    state, events = tick(state, 8.0)
    assert state.nodes[6].display == "online" and events == ()
    state, events = tick(state, 10.0)
    assert state.nodes[6].display == "suspected" and kinds(list(events)) == ["suspected"]
    state, events = tick(state, 20.0)
    assert state.nodes[6].display == "hung" and kinds(list(events)) == ["hung"]
    state, events = tick(state, 21.0)
    assert events == ()  # no repeated events while it stays hung
    state, events = apply_telemetry(state, Telemetry(6, 11, 1, "ft-tree", 0.1), 22.0)
    assert state.nodes[6].display == "online"
    assert "recovered" in kinds(list(events))


def test_a_paused_fleet_is_not_hung() -> None:
    state = _fleet_with_rounds(rounds=5, silent_from=5)
    state, events = tick(state, 500.0)
    assert all(n.display == "online" for n in state.nodes.values()) and events == ()


def test_offline_node_is_never_hung() -> None:
    state = _fleet_with_rounds(rounds=10, silent_from=4)
    state, _ = apply_status(state, Status(6, "offline"), 5.0)
    state, _ = tick(state, 100.0)
    assert state.nodes[6].display == "offline"


# ---------------------------------------------------------------- bounds and odd input


def test_ring_buffers_keep_memory_bounded() -> None:
    state = FleetState(max_rounds=5, max_events=4)
    for r in range(1, 21):
        msg = Telemetry(0, r, 1, "ft-tree", 0.1, events=[{"kind": "timeout", "peer": 1}])
        state, _ = apply_telemetry(state, msg, float(r))
    assert sorted(state.rounds) == [16, 17, 18, 19, 20]
    assert len(state.events) == 4 and state.next_seq == 21
    assert [e.seq for e in events_since(state, 18)] == [19, 20]
    state, _ = apply_telemetry(state, Telemetry(1, 3, 1, "ft-tree", 0.1), 21.0)
    assert 3 not in state.rounds and state.counters.late_telemetry == 1


def test_late_report_does_not_roll_node_back() -> None:
    state, _ = apply_telemetry(FleetState(), Telemetry(2, 9, 1, "ft", 0.1, loss=0.5), 1.0)
    state, _ = apply_telemetry(state, Telemetry(2, 8, 1, "ft", 0.1, loss=0.9), 2.0)
    assert state.nodes[2].last_round == 9 and state.nodes[2].loss == 0.5
    assert state.rounds[8].loss == 0.9


def test_odd_events_and_links_are_tolerated() -> None:
    msg = Telemetry(
        0, 1, 1, "ft", 0.1,
        links={"abc": "ok", "99999": "failed", "2": "failed"},
        events=[{"kind": "x" * 500, "peer": True, "detail": "d" * 5000}, {"peer": 3}],
    )
    state, events = apply_telemetry(FleetState(), msg, 0.0)
    assert set(state.nodes[0].links) == {2}
    assert len(events[0].kind) <= 32 and events[0].peer is None and len(events[0].detail) <= 200
    assert events[1].kind == "unknown"
    assert state.links[(0, 2)].kind == "extra" and state.links[(0, 2)].state == "failed"


def test_malformed_is_counted_by_reason() -> None:
    state, events = apply_malformed(FleetState(), "bad_json", 0.0)
    state, _ = apply_malformed(state, "bad_json", 0.0)
    state, _ = apply_malformed(state, "too_large", 0.0)
    assert dict(state.counters.malformed) == {"bad_json": 2, "too_large": 1}
    assert events == () and state.version == 3


def test_reducer_does_not_mutate_its_input() -> None:
    state, _ = final("reroute.jsonl")
    frozen_copy = replace(state)
    apply_telemetry(state, Telemetry(1, 9, 1, "ft", 0.1, links={"3": "failed"}), 99.0)
    assert state == frozen_copy and state.links[(1, 3)].state == "ok"


def test_a_node_out_of_the_view_but_not_offline_shows_as_evicted_until_it_rejoins() -> None:
    from dashboard.models import node_state

    state = _fleet_with_rounds(rounds=10, silent_from=4)  # node 6 last seen at t=4
    state, _ = tick(state, 20.0)
    assert state.nodes[6].display == "hung" and node_state(state.nodes[6], False) == "hung"
    # The fleet suspected it and took it out of the view: evicted while the page still sees it.
    assert node_state(state.nodes[6], True) == "evicted"
    state, _ = apply_status(state, Status(6, "joining", incarnation=state.nodes[6].incarnation), 21.0)
    assert node_state(state.nodes[6], True) != "evicted"  # on its way back
    state, _ = apply_status(state, Status(6, "offline", incarnation=state.nodes[6].incarnation), 22.0)
    assert node_state(state.nodes[6], True) == "offline"


def test_a_view_that_changes_only_the_chunk_size_is_on_the_timeline() -> None:
    state, _ = apply_view(FleetState(), View(1, [0, 1, 2], 2, 0, 0), 0.0)
    state, events = apply_view(state, View(2, [0, 1, 2], 2, 0, 6, chunk_values=32768), 1.0)
    assert [(e.kind, e.detail) for e in events] == [
        ("view_change", "epoch 2: 3 members, arity 2, chunks of 32,768 values")]
    _, events = apply_view(state, View(3, [0, 1, 2], 2, 0, 9), 2.0)
    assert [e.detail for e in events] == ["epoch 3: 3 members, arity 2, chunks as configured"]
    state, events = apply_view(state, View(3, [0, 1, 2], 2, 0, 9, chunk_values=32768, broadcast="fanout"), 2.0)
    assert [e.detail for e in events] == ["epoch 3: 3 members, arity 2, fanout broadcast"]
    _, events = apply_view(state, View(4, [0, 1, 2], 2, 0, 12, chunk_values=32768), 3.0)
    assert [e.detail for e in events] == ["epoch 4: 3 members, arity 2, broadcast as configured"]


def test_the_tree_is_the_agents_tree_rooted_at_the_views_coordinator() -> None:
    # A loaded host: node 0 joined late, node 1 coordinates and stays the root (as the agents'
    # view_tree has it); the page must not draw 0 as the root nor 1-3 as a tree link.
    view = View(epoch=3, members=[0, 1, 2, 3, 4, 5, 6], arity=2, coordinator=1, from_round=5)
    state, _ = apply_view(FleetState(), view, 1.0)
    tree = state.tree
    assert tree is not None and tree.root == 1 and tree.parent(3) == 0
    kinds = {(link.a, link.b): link.kind for link in state.links.values()}
    assert {k for k, kind in kinds.items() if kind == "tree"} == set(view_tree(view).tree_links())
    assert kinds[(0, 1)] == "tree" and kinds.get((1, 3)) != "tree"
    lowest, _ = apply_view(state, View(epoch=4, members=[0, 1, 2, 3, 4, 5, 6], arity=2,
                                       coordinator=0, from_round=9), 2.0)
    assert lowest.tree is not None and lowest.tree.root == 0 and lowest.tree.parent(3) == 1


def test_a_nodes_process_usage_is_its_latest_said() -> None:
    state = FleetState()
    base = {"epoch": 1, "algorithm": "ft", "wall_time": 0.1}
    state, _ = apply_telemetry(state, Telemetry(3, 1, cpu_percent=80.0, rss_bytes=5_000_000, **base), 0.0)
    state, _ = apply_telemetry(state, Telemetry(3, 2, cpu_percent=90.0, rss_bytes=6_000_000, **base), 0.1)
    assert (state.nodes[3].cpu_percent, state.nodes[3].rss_bytes) == (90.0, 6_000_000)
    state, _ = apply_telemetry(state, Telemetry(3, 3, **base), 0.2)  # says nothing of it: kept
    assert (state.nodes[3].cpu_percent, state.nodes[3].rss_bytes) == (90.0, 6_000_000)
    state, _ = apply_telemetry(state, Telemetry(3, 0, cpu_percent=1.0, rss_bytes=1, **base), 0.3)  # late
    assert (state.nodes[3].cpu_percent, state.nodes[3].rss_bytes) == (90.0, 6_000_000)
    assert FleetState().nodes.get(3) is None


def test_a_round_sums_its_samples_and_keeps_the_slowest_sync_and_compute() -> None:
    state = FleetState()
    for node, (compute, sync) in enumerate([(0.4, 1.0), (0.6, 0.9)]):
        msg = Telemetry(node=node, round=3, epoch=1, members=2, algorithm="ft-tree", wall_time=1.0, bytes_sent=3_000_000, local_steps=8, samples=800,
                        phase_seconds={"compute": compute, "allreduce": sync, "total": compute + sync})
        state, _ = apply_telemetry(state, msg, 1.0)
    r3 = state.rounds[3]
    assert (r3.local_steps, r3.samples) == (8, 1600)
    assert (r3.compute_seconds, r3.sync_seconds) == (0.6, 1.0)
    assert r3.bytes_per_sample == 6_000_000 / 1600
    silent, _ = apply_telemetry(FleetState(), Telemetry(node=0, round=0, epoch=1, members=1, algorithm="ft-tree", wall_time=1.0), 1.0)
    assert silent.rounds[0].bytes_per_sample is None  # an agent that does not say its samples
