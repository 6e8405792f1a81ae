"""One bad device with valid credentials, against a real 4-agent fleet on mosquitto with
dynamic security: it must not halt the fleet, poison everyone's model or go uncounted.

The attacker holds agent 3's credentials (a stolen or buggy device) and, while the fleet
trains, sends what issue 16 saw break the fleet: contributions with huge values, a model-pull
flood, and frames of a far-ahead round that used to make an agent abandon its round and adopt
whatever state answered."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.config import AgentConfig
from agent.model.backend import make_backend
from agent.model.mlp import PARAM_COUNT
from agent.protocol.allreduce import chunk_bounds
from agent.protocol.keys import MemberKeys
from agent.protocol.membership.evidence import seal
from agent.protocol.messages import StateDigest, Suspect, View
from agent.protocol.state_transfer import (
    STATE_CHUNK_VALUES,
    state_chunk_count,
    state_digest,
    state_hash,
)
from agent.protocol.topics import Topics
from agent.protocol.wire import DType, Frame, Kind, encode
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker, start_mosquitto
from simulate.fleet import Fleet
from tests.integration.fleet_harness import (
    FleetListener,
    agent_logs,
    device_keys,
    fleet_job_hash,
    second_session,
    start_fleet,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "hostile"
NODES = 4
ROUNDS = 40
# The forged-state test: with a kill and restart in both runs, when node 2 is back differs
# between them (its start-up on a loaded host), and with it the trajectory. After 60 rounds
# that put two clean runs 0.3-0.8 pp apart, after 120 0.1-0.4 pp, after 200 still up to 0.4
# pp (0.945-0.949 in seven runs, attacked or clean); 300 rounds leave the 0.5 pp a margin. A
# forged state installed gives chance accuracy (issue 16: 10 %).
LONG_ROUNDS = 300
# A short run the victim must rejoin before it ends: a loaded host took 4.6 s to restart it,
# the 30 rounds left of 40.
JOIN_ROUNDS = 120
EVAL_EVERY = 20  # the test set is evaluated after rounds 19, 39, ...
# An attacked run may end at most this far below the clean run, same rounds. Above it is no
# poisoning: a rejoin a round earlier or later moves the final accuracy by a few test samples.
ACCURACY_PP = 0.5
FLEET = {"eval_every": EVAL_EVERY}
MODEL_BYTES = 407_050 * 4
# What a pull flood kept up may add to its victim's round: one stripe (half a state: params and
# Adam's two moments), and one result resent to a child whose ACK was late on the busy host.
FLOOD_ROUND_EXTRA = 1.1 * 3 * MODEL_BYTES / 2 + MODEL_BYTES
VICTIM = 2  # of the forged state answers
# The agents' chunk geometry (default options): forged frames must fit it to be looked at.
CHUNKS = chunk_bounds(PARAM_COUNT, AgentConfig.model_fields["chunk_size"].default)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    # The attacker's second session with node 3's credentials stands in for what a compromised
    # node 3 would send over its own: the broker's client-id binding is off to allow it.
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=NODES, bind_client_ids=False) as b:
        yield b


@pytest.fixture(scope="module")
def clean_accuracy(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The test-set accuracy of a clean run of the same fleet: last round -> mean accuracy."""
    return _clean_run(tmp_path_factory.mktemp("clean"), ROUNDS, restart=False)


@pytest.fixture(scope="module")
def clean_restart_accuracy(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The same for a clean run in which node 2 is killed and restarts without a checkpoint
    at round 8 (what the forged-state test does, without the forgeries)."""
    return _clean_run(tmp_path_factory.mktemp("clean-restart"), LONG_ROUNDS, restart=True)


def _clean_run(tmp: Path, rounds: int, restart: bool) -> dict[int, float]:
    with start_mosquitto(tmp / "broker", job=JOB, nodes=NODES) as broker:
        creds = broker.dashboard_credentials
        listener = FleetListener(broker.url, JOB, creds.username, creds.password)
        fleet = start_fleet(broker, tmp, NODES, {"rounds": rounds, **FLEET})
        try:
            if restart:
                rejoined_at = _restart_without_checkpoint(fleet, listener, tmp, VICTIM)
                listener.wait_for(lambda: listener.last_rounds().get(VICTIM, -1) > rejoined_at + 5, 120, "the rejoin")
            listener.wait_for(lambda: listener.reached(list(range(NODES)), rounds - 1), 240, "the last round")
            return {rounds: _accuracy(listener, rounds - 1)}
        finally:
            fleet.stop_all(grace=10)
            listener.close()


def _restart_without_checkpoint(fleet: Fleet, listener: FleetListener, tmp: Path, node: int) -> int:
    """At round 8, ``node`` is killed and restarted with no checkpoint: it must rejoin by
    fetching the fleet's state. The fleet's round it rejoins at."""
    listener.wait_for(lambda: listener.reached([0, 1, 2, 3], 8), 120, "round 8")
    fleet.kill(node)
    for saved in (tmp / f"ckpt-{node}").glob("*"):
        saved.unlink()
    rejoined_at = listener.last(0).round + 1
    fleet.spawn(node)
    return rejoined_at


def _accuracy(listener: FleetListener, round_: int, nodes: tuple[int, ...] = tuple(range(NODES))) -> float:
    """The nodes' mean test-set accuracy after ``round_``."""
    accs = [t.accuracy for n in nodes for t in listener.telemetry[n] if t.round == round_]
    assert accs and all(a is not None for a in accs), f"no accuracy of round {round_}: {accs}"
    return float(np.mean([a for a in accs if a is not None]))


def _assert_accuracy(listener: FleetListener, clean: dict[int, float], rounds: int,
                     nodes: tuple[int, ...] = tuple(range(NODES))) -> None:
    attacked = _accuracy(listener, rounds - 1, nodes)
    print(f"accuracy after {rounds} rounds: {attacked:.4f} attacked, {clean[rounds]:.4f} clean")
    assert (clean[rounds] - attacked) * 100 <= ACCURACY_PP, (attacked, clean[rounds])


def _attacker(broker: MosquittoBroker) -> MqttTransport:
    return second_session(broker, 3)


def _attack(evil: MqttTransport, at_round: int, node0_round: int) -> None:
    topics, job = Topics(JOB), fleet_job_hash(JOB)
    # Forged contributions: valid CRC, a contributor set node 3 may send, values 1e20, for
    # the round after node 1's (kept until it starts, then taken before the real node 3's).
    # Node 1's telemetry lags it on a loaded host: the next two rounds too, so one is ahead.
    for r in (at_round, at_round + 1, at_round + 2):
        for j, (lo, hi) in enumerate(CHUNKS):
            frame = Frame(Kind.DATA, job, r, 3, j, len(CHUNKS), contributors=frozenset({3}))
            evil.publish(topics.link(3, 1), encode(frame.with_values(np.full(hi - lo, 1e20, np.float32), DType.F32)))
    # A model-pull flood on node 0, for a round it has reached (answered at once, each time).
    pull = encode(Frame(Kind.MODEL_PULL, job, node0_round, 3, 0, 1))
    for _ in range(400):
        evil.publish(topics.link(3, 0), pull)
    # A frame of a round far ahead: alone it must not make anybody give its round up.
    for dst in (0, 1, 2):
        evil.publish(topics.link(3, dst), encode(Frame(Kind.DATA, job, at_round + 6, 3, 0, len(CHUNKS),
                                                       contributors=frozenset({3}))
                                                 .with_values(np.zeros(CHUNKS[0][1], np.float32), DType.F32)))


def _keep_flooding(evil: MqttTransport, listener: FleetListener, rounds: int, pulls: int = 50,
                   claim_behind: MemberKeys | None = None) -> set[int]:
    """Model pulls on node 0 for each round it enters, ``rounds`` rounds in a row: what a
    compromised device can keep up (one burst is answered once; this tests the budget).
    ``claim_behind`` (node 3's keys): before each burst, "3 is behind" on node 3's self-report
    topic, signed."""
    topics, job = Topics(JOB), fleet_job_hash(JOB)
    flooded: set[int] = set()
    deadline = time.monotonic() + 120
    while len(flooded) < rounds and time.monotonic() < deadline:
        current = listener.last(0).round + 1
        if current not in flooded:
            flooded.add(current)
            if claim_behind is not None:
                evil.publish(topics.suspect(3), seal(claim_behind, Suspect(3, current + 1, 3)).encode())
            pull = encode(Frame(Kind.MODEL_PULL, job, current, 3, 0, 1))
            for _ in range(pulls):
                evil.publish(topics.link(3, 0), pull)
        listener.pump(0.02)
    return flooded


def test_a_hostile_device_neither_halts_nor_poisons_the_fleet_and_is_counted(
    broker: MosquittoBroker, tmp_path: Path, clean_accuracy: dict[int, float]
) -> None:
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = start_fleet(broker, tmp_path, NODES, {"rounds": ROUNDS, **FLEET})
    evil = _attacker(broker)
    try:
        listener.wait_for(lambda: listener.reached([0, 1, 2], 10), 120, "round 10")
        sent_before = [t.bytes_sent for t in listener.telemetry[0][3:10]]
        attacked_at = listener.last(1).round
        _attack(evil, attacked_at + 2, listener.last(0).round)
        flooded = _keep_flooding(evil, listener, rounds=8)
        listener.wait_for(lambda: listener.reached(list(range(NODES)), ROUNDS - 1), 240, "the last round")
        hashes = listener.hashes_at(ROUNDS - 1)
        assert len(set(hashes.values())) == 1, f"models differ: {hashes}\n{agent_logs(tmp_path)}"
        losses = {t.round: t.loss for t in listener.telemetry[0] if t.loss is not None}
        before = [losses[r] for r in range(attacked_at - 4, attacked_at + 1) if r in losses]
        after = [losses[r] for r in range(ROUNDS - 5, ROUNDS) if r in losses]
        # A gradient of 1e20 in Adam's second moment would freeze the model for good.
        assert np.mean(after) < np.mean(before) - 0.1, f"the fleet stopped learning: {before} -> {after}"
        _assert_accuracy(listener, clean_accuracy, ROUNDS)
        assert all(t.loss is not None and np.isfinite(t.loss) for ts in listener.telemetry.values() for t in ts)
        # What it tried is rejected and counted.
        assert listener.last(1).rejected.get("implausible_values", 0) >= 1, listener.last(1).rejected
        rejected = listener.last(0).rejected
        # (Unpadded, a pull pays for no state chunk: refused as unpaid, answer_budget.py.)
        assert sum(rejected.get(k, 0) for k in ("model_pull_repeat", "model_pull_budget", "pull_unpaid")) >= 100, rejected
        # The flood did not turn node 0 into an amplifier (before: 4.3 GB in 10 s): 400 pulls
        # in one burst get at most one state (params + Adam moments) per round; the slack is
        # for a round whose broadcast was also resent to a child (timers, not the flood).
        flood = max(t.bytes_sent for t in listener.telemetry[0][10:20])
        state_bytes = 3 * 407_050 * 4
        per_round = [(t.round, round(t.bytes_sent / 1e6, 2)) for t in listener.telemetry[0][5:25]]
        assert flood <= max(sent_before) + 1.1 * state_bytes + 2 * 407_050 * 4, (per_round, sent_before)
        # Kept up in every round, the flood gets one stripe (half a state) per round: every
        # round of the victim's sends at most that more than its normal round, and a result
        # resent to a child (before: a whole state every 4 rounds; this check failed on that
        # code). In bytes, not as a ratio: the root's normal round is one fan-out publish,
        # half of what it was relayed down the tree (a copy per child).
        during = [t.bytes_sent for t in listener.telemetry[0] if t.round in flooded]
        worst = max(during) / float(np.mean(sent_before))
        extra = max(during) - float(np.mean(sent_before))
        print(f"pull flood: node 0 sent at most {flood / 1e6:.2f} MB in a round "
              f"({flood / max(sent_before):.2f}x its largest normal round); kept up for "
              f"{len(during)} rounds, {np.mean(during) / np.mean(sent_before):.2f}x its mean normal "
              f"round, at most {worst:.2f}x in one")
        assert len(during) >= 6 and extra <= FLOOD_ROUND_EXTRA, (per_round, sent_before)
        assert rejected.get("model_pull_budget", 0) + rejected.get("pull_unpaid", 0) >= 1, rejected
        assert not listener.events(0, "abandoned") and not listener.events(2, "abandoned")
    finally:
        evil.close()
        forced = fleet.stop_all(grace=10)
        listener.close()
        assert forced == [], agent_logs(tmp_path)


def test_a_device_that_keeps_saying_it_is_behind_gets_no_whole_state_every_round(
    broker: MosquittoBroker, tmp_path: Path, clean_accuracy: dict[int, float]
) -> None:
    """A member behind (or joining) is served at once, by every peer, one stripe each. With
    node 3's credentials, "3 is behind" on its self-report topic every round and pulls of the
    whole state from node 0: it got one every round (node 0 at 2.5x its normal round, for as
    long as it kept it up). Now one stripe a round."""
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = start_fleet(broker, tmp_path, NODES, {"rounds": ROUNDS, **FLEET})
    evil = _attacker(broker)
    try:
        listener.wait_for(lambda: listener.reached([0, 1, 2], 10), 120, "round 10")
        sent_before = [t.bytes_sent for t in listener.telemetry[0][3:10]]
        flooded = _keep_flooding(evil, listener, rounds=8, pulls=20, claim_behind=device_keys(broker, 3))
        listener.wait_for(lambda: listener.reached([0, 1, 2], ROUNDS - 1), 240, "the last round")
        hashes = listener.hashes_at(ROUNDS - 1)
        assert len({hashes[n] for n in (0, 1, 2)}) == 1, f"models differ: {hashes}\n{agent_logs(tmp_path)}"
        _assert_accuracy(listener, clean_accuracy, ROUNDS, nodes=(0, 1, 2))
        during = [t.bytes_sent for t in listener.telemetry[0] if t.round in flooded]
        worst = max(during) / float(np.mean(sent_before))
        extra = max(during) - float(np.mean(sent_before))
        print(f"behind-claim flood: node 0 sent {np.mean(during) / np.mean(sent_before):.2f}x its mean "
              f"normal round over {len(during)} rounds (at most {worst:.2f}x in one)")
        assert len(during) >= 6 and extra <= FLOOD_ROUND_EXTRA, ([round(b / 1e6, 2) for b in during], sent_before)
        rejected = listener.last(0).rejected
        assert rejected.get("model_pull_budget", 0) + rejected.get("pull_unpaid", 0) >= 1, rejected
    finally:
        evil.close()
        forced = fleet.stop_all(grace=10)
        listener.close()
        assert forced == [], agent_logs(tmp_path)


def _forge_states(evil: MqttTransport, victim: int, rounds: range) -> None:
    """MODEL frames as node 3, to ``victim``, of a state with parameters 0 and Adam's second
    moment 3e38, hashed consistently: one chunk of each stripe for each round. Its full
    digest is announced for each round on node 3's state topic, as node 3's and (refused:
    the topic names 3) as the coordinator's."""
    topics, job = Topics(JOB), fleet_job_hash(JOB)
    size = make_backend("numpy", np.random.default_rng(0)).state_size
    count = state_chunk_count(size, STATE_CHUNK_VALUES)
    forged = np.zeros(size, np.float32)
    forged[2 * size // 3:] = 3e38
    digest = state_hash(forged)
    for r in rounds:
        for claimed in (3, 0):
            evil.publish(topics.state(3), StateDigest(claimed, r, state_digest(forged)).encode(), retain=True)
        for j in (0, 1):
            values = forged[j * STATE_CHUNK_VALUES:(j + 1) * STATE_CHUNK_VALUES]
            frame = Frame(Kind.MODEL, job, r, 3, j, count, target=victim, model_hash=digest)
            evil.publish(topics.link(3, victim), encode(frame.with_values(values, DType.F32)))


def _forge_while_rejoining(fleet: Fleet, listener: FleetListener, evil: MqttTransport, tmp: Path,
                           victim: int, rounds: int) -> dict[int, str]:
    """``victim`` restarts without a checkpoint while node 3's credentials answer with forged
    states, for the rounds around the fleet's, until it is 5 rounds back; then the members'
    model hashes at the fleet's last round."""
    rejoined_at = _restart_without_checkpoint(fleet, listener, tmp, victim)
    deadline = time.monotonic() + 120
    while not (listener.last_rounds().get(victim, -1) > rejoined_at + 5):
        assert time.monotonic() < deadline, f"node {victim} never rejoined\n{agent_logs(tmp)}"
        fleet_round = listener.last(0).round
        _forge_states(evil, victim, range(fleet_round, fleet_round + 3))
        listener.pump(0.4)  # a forgery, not a flood (the flood is the test above)
    listener.wait_for(lambda: listener.reached(list(range(NODES)), rounds - 1), 240, "the last round")
    return listener.hashes_at(rounds - 1)


def test_a_forged_state_answer_is_never_installed(
    broker: MosquittoBroker, tmp_path: Path, clean_restart_accuracy: dict[int, float]
) -> None:
    """Node 2 crashes and comes back without a checkpoint, so it must pull the fleet's state,
    while node 3's credentials keep answering with a forged state (issue 16: params 0 and
    Adam v = 3e38, adopted by the whole fleet). It rejoins with the fleet's model."""
    victim, rounds = VICTIM, LONG_ROUNDS
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = start_fleet(broker, tmp_path, NODES, {"rounds": rounds, **FLEET})
    evil = _attacker(broker)
    try:
        hashes = _forge_while_rejoining(fleet, listener, evil, tmp_path, victim, rounds)
        assert len(set(hashes.values())) == 1, f"models differ: {hashes}\n{agent_logs(tmp_path)}"
        losses = [t.loss for t in listener.telemetry[victim] if t.loss is not None]
        assert losses and all(np.isfinite(losses)) and losses[-1] < 2.0, losses[-5:]
        _assert_accuracy(listener, clean_restart_accuracy, rounds)
        rejected = listener.last(victim).rejected
        assert rejected.get("state_unasked", 0) + rejected.get("state_rejected", 0) >= 1, rejected
        assert rejected.get("state_digest_forged", 0) >= 1, rejected
    finally:
        evil.close()
        forced = fleet.stop_all(grace=10)
        listener.close()
        assert forced == [], agent_logs(tmp_path)


def test_a_joiner_installs_only_the_state_the_coordinator_announced(broker: MosquittoBroker, tmp_path: Path) -> None:
    """The forged-state attack over a short run (the accuracy is the long test's): node 2
    rejoins without a checkpoint while node 3's credentials answer with a forged state and
    announce its digest as node 3's and in the coordinator's name. Through the broker's
    ACL the coordinator's announcements reach the joiner, which installs the fleet's state
    (it rejoins, with the fleet's model) and refuses the announcement in another's name."""
    victim, rounds = VICTIM, JOIN_ROUNDS
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = start_fleet(broker, tmp_path, NODES, {"rounds": rounds, **FLEET})
    evil = _attacker(broker)
    try:
        hashes = _forge_while_rejoining(fleet, listener, evil, tmp_path, victim, rounds)
        assert len(set(hashes.values())) == 1 and len(hashes) == NODES, f"models differ: {hashes}\n{agent_logs(tmp_path)}"
        rejected = listener.last(victim).rejected
        assert rejected.get("state_digest_forged", 0) >= 1, rejected
    finally:
        evil.close()
        forced = fleet.stop_all(grace=10)
        listener.close()
        assert forced == [], agent_logs(tmp_path)


def test_forged_views_neither_split_nor_halt_the_fleet(
    broker: MosquittoBroker, tmp_path: Path, clean_accuracy: dict[int, float]
) -> None:
    """Issue 16: with node 3's credentials, retained views on view/3 (the only view topic the
    ACL lets it write): a coordinator's view it has no right to publish, one naming itself
    coordinator of a two-member fleet, and one with an epoch near 2^53. Before: two agents
    stuck for good, or the fleet split."""
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = start_fleet(broker, tmp_path, NODES, {"rounds": ROUNDS, **FLEET})
    evil = _attacker(broker)
    topic = Topics(JOB).view_of(3)
    try:
        listener.wait_for(lambda: listener.reached(list(range(NODES)), 8), 120, "round 8")
        epoch, now, model = listener.views[-1].epoch, listener.last(0).round, listener.views[-1].fingerprint
        for view in (View(epoch + 1, [0, 1], 2, 0, now + 1, fingerprint=model),  # "from" the coordinator
                     View(epoch + 1, [2, 3], 2, 3, now + 1, fingerprint=model),  # itself as coordinator
                     View(2**53, [3], 2, 3, now + 1, fingerprint=model)):  # an epoch nobody can follow
            evil.publish(topic, seal(device_keys(broker, 3), view).encode(), retain=True)  # its own key
            listener.pump(0.5)
        listener.wait_for(lambda: listener.reached(list(range(NODES)), ROUNDS - 1), 240, "the last round")
        hashes = listener.hashes_at(ROUNDS - 1)
        assert len(hashes) == NODES and len(set(hashes.values())) == 1, f"{hashes}\n{agent_logs(tmp_path)}"
        assert all(t.members == NODES for t in listener.telemetry[0][-5:]), "the fleet split"
        _assert_accuracy(listener, clean_accuracy, ROUNDS)
        for node in (0, 1, 2):
            rejected = listener.last(node).rejected
            assert rejected.get("view_not_its_publishers", 0) >= 1, (node, rejected)
            assert rejected.get("view_epoch_jump", 0) + rejected.get("view_not_coordinator", 0) >= 1, (node, rejected)
    finally:
        evil.close()
        forced = fleet.stop_all(grace=10)
        listener.close()
        assert forced == [], agent_logs(tmp_path)
