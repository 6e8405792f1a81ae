"""Issue 54.1, evidence not assertions: one compromised device against the fleet's control
plane, from its own credentials and with its own device key (it signs what it sends), on a
real fleet on dynamic-security mosquitto. 4 and 7 agents, the attacker at a leaf and at an
inner node (the member next in line to coordinate: the one a takeover would favour).

(a) a takeover in two messages: a signed suspicion of the coordinator for the next round and a
    signed view naming the attacker coordinator. Before: node 0 yielded, the attacker ruled.
(b) a flood of garbage frames on the root's link: each refused and counted. Before: the root
    looked silent, was evicted, the attacker coordinated.
(c) a status whose signature no longer fits it, one signed with a key the job never pinned for
    its node, and genuine signed suspicions of an old round replayed in a view's certificate:
    each refused and counted by its reason.

In every case the coordinator stays node 0, every member stays in the view and one model is
on all honest members at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from agent.protocol.keys import MemberKeys, new_private_key
from agent.protocol.membership import view_tree
from agent.protocol.membership.evidence import evidence_of, seal
from agent.protocol.messages import Suspect, View
from agent.protocol.topics import Topics
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker, start_mosquitto
from tests.integration.fleet_harness import (
    FleetListener,
    agent_logs,
    device_keys,
    second_session,
    start_fleet,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "sigs-attack"
ROUNDS = 24
ATTACK_AT = 4  # the fleet's round the attack starts at
ATTACK_ROUNDS = 10  # rounds it is kept up
FLOOD_ROUNDS = 40
FLEETS = [(4, "leaf"), (4, "inner"), (7, "leaf"), (7, "inner")]
Attack = Callable[[MqttTransport, MemberKeys, FleetListener], None]


def _attacker_at(nodes: int, where: str) -> int:
    tree = view_tree(View(0, list(range(nodes)), 2, 0, 0))
    inner = [n for n in range(1, nodes) if tree.children(n)]
    leaves = [n for n in range(1, nodes) if not tree.children(n)]
    return min(inner) if where == "inner" else max(leaves)


@pytest.fixture(params=FLEETS, ids=[f"{n}-agents-{w}" for n, w in FLEETS])
def fleet_setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[MosquittoBroker, int, int]]:
    nodes, where = request.param
    # The attacker's second session with its node's credentials stands in for what a
    # compromised device sends over its own: the broker's client-id binding is off to allow it.
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=nodes, bind_client_ids=False) as broker:
        yield broker, nodes, _attacker_at(nodes, where)


def _each_round(listener: FleetListener, act: Callable[[int], None], flood: bool = False) -> None:
    """``act(fleet_round)`` once as node 0 enters each round (``flood``: again and again), for
    ATTACK_ROUNDS rounds in a row: paced by the fleet's progress, not the clock (a loaded host
    runs slow rounds)."""
    done: set[int] = set()
    deadline = time.monotonic() + 300
    while len(done) < ATTACK_ROUNDS:
        assert time.monotonic() < deadline, f"the fleet stalled under attack: {listener.last_rounds()}"
        current = listener.last(0).round + 1
        if flood or current not in done:
            done.add(current)
            act(current)
        listener.pump(0.01 if flood else 0.05)


def _fleet_view(listener: FleetListener, attacker: int) -> View:
    """The newest of the fleet's own views (not the attacker's, which nobody took)."""
    return max((v for v in listener.views if v.coordinator != attacker), key=lambda v: v.epoch)


def _forged_view(listener: FleetListener, attacker: int, nodes: int, from_round: int, reports: list[Suspect]) -> View:
    """The fleet's view as the attacker would forge it (it knows the model it trains): the next
    epoch, without node 0, itself coordinating, the reports as evidence."""
    fleet = _fleet_view(listener, attacker)
    return replace(fleet, epoch=fleet.epoch + 1, members=[n for n in range(nodes) if n != 0], coordinator=attacker,
                   from_round=from_round, evidence=evidence_of(reports), sig="")


def _run(setup: tuple[MosquittoBroker, int, int], tmp: Path, attack: Attack, rounds: int = ROUNDS) -> FleetListener:
    """A fleet of ``rounds`` rounds attacked from ATTACK_AT on: it ends with every member in the
    view, one model on all of them, node 0 coordinating. The listener, for the counts."""
    broker, nodes, attacker = setup
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    evil, keys = second_session(broker, attacker), device_keys(broker, attacker)
    fleet = start_fleet(broker, tmp, nodes, {"rounds": rounds, "round_deadline": 5.0})
    everyone = list(range(nodes))
    try:
        listener.wait_for(lambda: listener.reached(everyone, ATTACK_AT), 240, f"round {ATTACK_AT}")
        attack(evil, keys, listener)
        listener.wait_for(lambda: listener.reached(everyone, rounds - 1), 300, "the last round")
        hashes = listener.hashes_at(rounds - 1)
        assert len(hashes) == nodes and len(set(hashes.values())) == 1, f"{hashes}\n{agent_logs(tmp)}"
        assert all(t.members == nodes for n in everyone for t in listener.telemetry[n][-2:]), "a member left"
        # Only node 0 coordinated (the attacker's views name it, and nobody took them).
        assert {v.coordinator for v in listener.views} <= {0, attacker}, listener.views
        assert all(listener.last(n).members == nodes for n in everyone)
        assert not listener.events(0, "rejoin_needed"), "the coordinator left"
        return listener
    finally:
        evil.close()
        forced = fleet.stop_all(grace=10)
        listener.close()
        assert forced == [], agent_logs(tmp)


def _rejected(listener: FleetListener, node: int, *reasons: str) -> int:
    """How many of the attacker's messages ``node`` refused for any of ``reasons`` (over the
    run: the counters are cumulative in telemetry)."""
    return sum(max((t.rejected.get(r, 0) for t in listener.telemetry[node]), default=0) for r in reasons)


def _honest(setup: tuple[MosquittoBroker, int, int]) -> list[int]:
    _, nodes, attacker = setup
    return [n for n in range(nodes) if n != attacker]


def test_a_suspicion_and_a_view_do_not_take_the_coordinator_over(
        fleet_setup: tuple[MosquittoBroker, int, int], tmp_path: Path) -> None:
    _, nodes, attacker = fleet_setup
    topics = Topics(JOB)

    def attack(evil: MqttTransport, keys: MemberKeys, listener: FleetListener) -> None:
        def act(fleet_round: int) -> None:
            report = seal(keys, Suspect(attacker, fleet_round + 1, 0))
            evil.publish(topics.suspect(attacker), report.encode())
            view = _forged_view(listener, attacker, nodes, fleet_round + 1, [report])
            evil.publish(topics.view_of(attacker), seal(keys, view).encode(), retain=True)

        _each_round(listener, act)

    listener = _run(fleet_setup, tmp_path, attack)
    assert _rejected(listener, 0, "view_removal_uncertified") >= 1, listener.last(0).rejected
    for node in _honest(fleet_setup):
        assert _rejected(listener, node, "view_removal_uncertified", "view_not_coordinator",
                         "view_coordinator_uncertified") >= 1, (node, listener.last(node).rejected)


def test_a_garbage_flood_on_the_roots_link_leaves_the_root_coordinating(
        fleet_setup: tuple[MosquittoBroker, int, int], tmp_path: Path) -> None:
    _, _, attacker = fleet_setup
    link = Topics(JOB).link(attacker, 0)
    sent = [0]

    def attack(evil: MqttTransport, keys: MemberKeys, listener: FleetListener) -> None:
        def act(fleet_round: int) -> None:
            for _ in range(200):
                evil.publish(link, os.urandom(512))
            sent[0] += 200

        _each_round(listener, act, flood=True)

    # The root drains what the broker queued for it (up to its 64 MB) for a while after the
    # flood: degraded rounds, then the fleet's one model again.
    listener = _run(fleet_setup, tmp_path, attack, rounds=FLOOD_ROUNDS)
    refused = max(sum(t.rejected.values()) for t in listener.telemetry[0])
    print(f"garbage flood: {sent[0]} frames sent on {link}, node 0 refused and counted {refused}")
    assert refused >= sent[0] // 2, (sent[0], listener.last(0).rejected)


def test_forged_unknown_and_replayed_signatures_are_refused_and_counted(
        fleet_setup: tuple[MosquittoBroker, int, int], tmp_path: Path) -> None:
    broker, nodes, attacker = fleet_setup
    topics = Topics(JOB)
    stranger = MemberKeys.of_private(attacker, new_private_key(), {})  # a key the job never pinned
    old: list[Suspect] = []

    def attack(evil: MqttTransport, keys: MemberKeys, listener: FleetListener) -> None:
        status = listener.status[attacker]
        # Genuine signed suspicions from ATTACK_AT rounds ago, as a member would have seen them
        # on the suspect topics: replayed later in a view's certificate.
        start = listener.last(0).round
        old.extend(seal(device_keys(broker, n), Suspect(n, start, 0)) for n in range(1, nodes))
        # (Signed here with their keys: what the attacker recorded off the wire, not what it holds.)

        def act(fleet_round: int) -> None:
            forged = replace(seal(keys, replace(status, round=fleet_round)), round=fleet_round + 1)
            evil.publish(topics.status(attacker), forged.encode())  # the signature no longer fits
            evil.publish(topics.status(attacker), seal(stranger, replace(status, round=fleet_round)).encode())
            if fleet_round >= start + 6:
                fresh = seal(keys, Suspect(attacker, fleet_round, 0))  # its own word, and the replay
                evil.publish(topics.suspect(attacker), fresh.encode())
                replay = _forged_view(listener, attacker, nodes, fleet_round + 1,
                                      [fresh, *(r for r in old if r.node != attacker)])
                evil.publish(topics.view_of(attacker), seal(keys, replay).encode(), retain=True)

        _each_round(listener, act)

    listener = _run(fleet_setup, tmp_path, attack)
    for node in _honest(fleet_setup):
        assert _rejected(listener, node, "status_bad_signature") >= 2, (node, listener.last(node).rejected)
    assert _rejected(listener, 0, "view_evidence_stale") >= 1, listener.last(0).rejected
