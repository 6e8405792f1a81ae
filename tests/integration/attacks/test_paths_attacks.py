"""Issue 54.3 and 54.4 from one member's own credentials, on real 4- and 7-agent fleets on
mosquitto with dynamic security: a backup that injects a round's result, and pull floods.

Trees (arity 2): with 4 agents 0 is the root over 1 and 2, 3 a leaf below 1; with 7, 1 is
over 3 and 4, 2 over 5 and 6. A backup of a node is its sibling (else its first uncle): 1 is
2's (an inner node), 3 is 4's (a leaf). The attacker's second session with the attacker's
credentials stands in for what that compromised device sends over its own connection.

Amplification, as answer_budget.py defines it: the bytes of the answers to the attacker's
asks (result chunks and state chunks addressed to it, read on its own inbox topic from the
flooded node) divided by the bytes of the asks it published to that node, over the attack.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agent.config import AgentConfig
from agent.model.backend import make_backend
from agent.model.mlp import PARAM_COUNT
from agent.protocol.allreduce import chunk_bounds
from agent.protocol.answer_budget import AMPLIFICATION, padded, values_frame_bytes
from agent.protocol.messages import Suspect
from agent.protocol.state_transfer import STATE_CHUNK_VALUES, state_chunk_count, state_frame_bytes
from agent.protocol.topics import Topics
from agent.protocol.wire import DType, Flag, Frame, Kind, decode, encode
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker, start_mosquitto
from tests.integration.fleet_harness import (
    FleetListener,
    agent_logs,
    fleet_job_hash,
    second_session,
    start_fleet,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "paths"
ROUNDS = 24
# The flood test's fleet: two phases of the flood, each followed by a wait for its last
# answers (rounds go on meanwhile: tens of them on an idle host).
FLOOD_ROUNDS = 90
PHASE_ROUNDS = 6
DRAIN_S = 3.0
ATTACK_AT = 4  # the fleet's round the attack starts at
ATTACK_ROUNDS = 12  # rounds the attack is kept up, paced by the fleet
CHUNKS = chunk_bounds(PARAM_COUNT, AgentConfig.model_fields["chunk_size"].default)
UNPAID_ASKS = 40  # unpadded asks of each kind per round: what a flood costs its sender


@dataclass(frozen=True)
class Seat:
    nodes: int
    attacker: int
    victim: int  # the node the attack is aimed at

    @property
    def label(self) -> str:
        return f"{self.nodes}-agents-{self.attacker}-on-{self.victim}"


# A backup: the inner node 1 of both trees on its sibling 2, the leaf 3 on its sibling 4.
INJECTIONS = [Seat(4, 1, 2), Seat(7, 1, 2), Seat(7, 3, 4)]
# A flood: from a leaf and from an inner node, on nodes the attacker's own agent sends
# nothing else to (its data would pay for answers too, and the meter counts only the asks):
# the root, a sibling, nodes below the root's other child.
FLOODS = [Seat(4, 3, 0), Seat(4, 1, 2), Seat(7, 1, 5), Seat(7, 3, 6)]


def _broker(tmp: Path, seat: Seat) -> MosquittoBroker:
    # Client-id binding off: the attacker's second session with its own credentials.
    return start_mosquitto(tmp / "broker", job=JOB, nodes=seat.nodes, bind_client_ids=False)


def _each_round(listener: FleetListener, act: Callable[[int], None], rounds: int = ATTACK_ROUNDS) -> None:
    """``act(fleet_round)`` once for each round node 0 enters, ``rounds`` rounds in a row."""
    done: set[int] = set()
    deadline = time.monotonic() + 300
    while len(done) < rounds:
        assert time.monotonic() < deadline, f"the fleet stalled under attack: {listener.last_rounds()}"
        current = listener.last(0).round + 1
        if current not in done:
            done.add(current)
            act(current)
        listener.pump(0.05)


def _run(broker: MosquittoBroker, tmp: Path, seat: Seat, attack: Callable[[MqttTransport, FleetListener], None],
         rounds: int = ROUNDS) -> FleetListener:
    """A fleet of ``rounds`` rounds, attacked from ATTACK_AT on: it ends with one model on
    every member, every member in the view. The listener, for the counts."""
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    evil = second_session(broker, seat.attacker)
    fleet = start_fleet(broker, tmp, seat.nodes, {"rounds": rounds})
    everyone = list(range(seat.nodes))
    try:
        listener.wait_for(lambda: listener.reached(everyone, ATTACK_AT), 240, f"round {ATTACK_AT}")
        attack(evil, listener)
        listener.wait_for(lambda: listener.reached(everyone, rounds - 1), 300, "the last round")
        hashes = listener.hashes_at(rounds - 1)
        assert len(hashes) == seat.nodes and len(set(hashes.values())) == 1, f"{hashes}\n{agent_logs(tmp)}"
        assert all(t.members == seat.nodes for n in everyone for t in listener.telemetry[n][-3:]), "a split"
        return listener
    finally:
        evil.close()
        forced = fleet.stop_all(grace=10)
        listener.close()
        assert forced == [], agent_logs(tmp)


# ---------------------------------------------------------------------------- 54.3


def _forged_results(seat: Seat, round_: int, job: int) -> list[bytes]:
    """The round's whole result, from the attacker to its victim: sent as its own (an answer
    nobody asked for) and as relayed from the victim's parent (a reroute nobody made)."""
    parent = (seat.victim - 1) // 2
    out: list[bytes] = []
    for j, (lo, hi) in enumerate(CHUNKS):
        values = np.full(hi - lo, 0.5, np.float32)
        own = Frame(Kind.DATA, job, round_, seat.attacker, j, len(CHUNKS), Flag.BROADCAST | Flag.FINAL,
                    target=seat.victim, contributors=frozenset(range(seat.nodes)))
        relayed = Frame(Kind.RELAY, job, round_, seat.attacker, j, len(CHUNKS), Flag.BROADCAST | Flag.FINAL,
                        origin=parent, target=seat.victim, contributors=frozenset(range(seat.nodes)))
        out += [encode(own.with_values(values, DType.F32)), encode(relayed.with_values(values, DType.F32))]
    return out


@pytest.mark.parametrize("seat", INJECTIONS, ids=lambda s: s.label)
def test_a_backup_cannot_inject_a_rounds_result(tmp_path: Path, seat: Seat) -> None:
    """Issue 54: the victim's sibling sent it results for the rounds ahead, buffered and taken
    before the root's (its model differed in 189 of 200 rounds, 90 full state re-syncs,
    nothing counted). Now nothing from a backup is installed unless the victim made it a
    carrier itself (it pulled from it, or went around its parent): refused, counted."""
    topics, job = Topics(JOB), fleet_job_hash(JOB)

    def attack(evil: MqttTransport, listener: FleetListener) -> None:
        def act(fleet_round: int) -> None:
            for r in (fleet_round, fleet_round + 1, fleet_round + 2):
                for payload in _forged_results(seat, r, job):
                    evil.publish(topics.link(seat.attacker, seat.victim), payload)

        _each_round(listener, act)

    with _broker(tmp_path, seat) as broker:
        listener = _run(broker, tmp_path, seat, attack)
    refused = listener.last(seat.victim).rejected.get("result_backup_not_routed", 0)
    resyncs = len(listener.events(seat.victim, "resync"))
    print(f"{seat.label}: {refused} forged result frames refused as result_backup_not_routed, "
          f"{resyncs} resyncs of the victim, models identical at round {ROUNDS - 1}")
    assert refused >= ATTACK_ROUNDS, listener.last(seat.victim).rejected
    # A backup the victim made a carrier (its parent looked lost to it on a loaded host) is
    # believed for that round: one resync then, as docs/SECURITY.md says (results from the
    # root's path, "What it does not guarantee"); undefended, 90 in 200 rounds.
    assert resyncs <= 1, "the victim's model left the fleet's more than once"


# ---------------------------------------------------------------------------- 54.4


class Meter:
    """The attacker's side of a flood: the bytes it asks with, the answers on its inbox, by
    phase of the attack."""

    def __init__(self, broker: MosquittoBroker, seat: Seat) -> None:
        creds = broker.credentials_for(seat.attacker)
        self.topics, self.seat = Topics(JOB), seat
        self.inbox = MqttTransport(f"edgegrove-{JOB}-{seat.attacker}-meter", broker.url,
                                   username=creds.username, password=creds.password)
        self.inbox.connect([self.topics.link(seat.victim, seat.attacker)])
        self.phase = "unpaid"
        self.asked: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()

    def ask(self, evil: MqttTransport, payload: bytes) -> None:
        evil.publish(self.topics.link(self.seat.attacker, self.seat.victim), payload)
        self.asked[self.phase] += len(payload)

    def read(self, timeout: float = 0.0) -> None:
        for message in self.inbox.receive(timeout):
            frame = decode(message.payload)
            if isinstance(frame, Frame) and (frame.kind is Kind.MODEL or (
                    frame.kind is Kind.DATA and frame.flags & Flag.FINAL)):
                self.answered[self.phase] += len(message.payload)
                self.answers[self.phase] += 1

    def drain(self) -> None:
        """The phase's last answers: still on their way for a moment."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            self.read(0.2)

    def amplification(self, phase: str) -> float:
        return self.answered[phase] / self.asked[phase]

    def figures(self, phase: str) -> str:
        return (f"{phase}: asked with {self.asked[phase] / 1e6:.3f} MB, answered with "
                f"{self.answered[phase] / 1e6:.3f} MB in {self.answers[phase]} frames: "
                f"{self.amplification(phase):.2f}x by bytes")


@functools.cache
def _state_bytes() -> int:
    """Bytes of the MODEL frames of the agents' whole training state."""
    size = int(make_backend("numpy", np.random.default_rng(0)).state().size)
    return sum(state_frame_bytes(size, STATE_CHUNK_VALUES, j) for j in range(state_chunk_count(size, STATE_CHUNK_VALUES)))


def _asks(seat: Seat, round_: int, job: int, paid: bool) -> list[bytes]:
    """One round's flood: unpadded pulls of the whole result and of the whole state, and
    (``paid``) one of each padded to pay for all it asks, as an honest asker pads."""
    result = sum(values_frame_bytes(hi - lo, 4, seat.nodes - 1) for lo, hi in CHUNKS)
    pull = Frame(Kind.PULL, job, round_, seat.attacker, 0, len(CHUNKS), Flag.BROADCAST).with_indices([])
    model_pull = Frame(Kind.MODEL_PULL, job, round_, seat.attacker, 0, 1).with_indices([])
    flood = [encode(pull), encode(model_pull)] * UNPAID_ASKS
    return flood + ([encode(padded(pull, result)), encode(padded(model_pull, _state_bytes()))] if paid else [])


@pytest.mark.parametrize("seat", FLOODS, ids=lambda s: s.label)
def test_pull_floods_are_answered_with_at_most_three_times_their_bytes(tmp_path: Path, seat: Seat) -> None:
    """Issue 54: a PULL's answer was ~5,100x its bytes, a MODEL_PULL's ~7,000x (capped per
    round). Each round of the attack the attacker says it is behind and floods its victim
    with unpadded pulls of the whole result and the whole state; in a second phase it adds
    one padded pull of each a round. The answers stay within AMPLIFICATION x the asks'
    bytes in each phase, the unpaid asks counted, the paid ones answered."""
    topics, job = Topics(JOB), fleet_job_hash(JOB)
    sent: dict[str, list[int]] = {}

    def attack(evil: MqttTransport, listener: FleetListener) -> None:
        sent["before"] = [t.bytes_sent for t in listener.telemetry[seat.victim][1:ATTACK_AT]]
        flooded: list[int] = []
        for phase in ("unpaid", "paid"):
            meter.phase = phase

            def act(fleet_round: int) -> None:
                flooded.append(fleet_round)
                evil.publish(topics.suspect(seat.attacker), Suspect(seat.attacker, fleet_round + 1, seat.attacker).encode())
                for payload in _asks(seat, fleet_round, job, paid=meter.phase == "paid"):
                    meter.ask(evil, payload)
                meter.read()

            _each_round(listener, act, PHASE_ROUNDS)
            meter.drain()
        sent["during"] = [t.bytes_sent for t in listener.telemetry[seat.victim] if t.round in flooded]

    with _broker(tmp_path, seat) as broker:
        meter = Meter(broker, seat)
        try:
            listener = _run(broker, tmp_path, seat, attack, FLOOD_ROUNDS)
        finally:
            meter.inbox.close()
    rejected = listener.last(seat.victim).rejected
    before, during = np.mean(sent["before"]), np.mean(sent["during"])
    print(f"{seat.label}: {meter.figures('unpaid')}; {meter.figures('paid')}; victim sent "
          f"{during / 1e6:.2f} MB a round under attack, {before / 1e6:.2f} MB before; "
          f"pull_unpaid {rejected.get('pull_unpaid', 0)}")
    for phase in ("unpaid", "paid"):
        assert meter.amplification(phase) <= AMPLIFICATION, meter.figures(phase)
    assert meter.answers["paid"] >= 1, "a padded pull is answered"
    assert rejected.get("pull_unpaid", 0) >= PHASE_ROUNDS, rejected
