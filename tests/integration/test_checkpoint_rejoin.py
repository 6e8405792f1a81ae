"""Issue 16: an agent restarted on a corrupt or implausible checkpoint sets it aside with one
warning and rejoins the running fleet by pulling its state (real mosquitto, real agents)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from agent import checkpoint
from simulate.brokers import MosquittoBroker, start_mosquitto
from simulate.fleet import Fleet
from tests.integration.fleet_harness import FleetListener, agent_logs, start_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "itest-ckpt"
NODES = 4
VICTIM = 3


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_bits(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x40
    path.write_bytes(bytes(data))


def _rewrite(change: Callable[[checkpoint.Checkpoint], checkpoint.Checkpoint]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        checkpoint.save(path.parent, change(checkpoint.read(path)))
    return damage


def _nan(saved: checkpoint.Checkpoint) -> checkpoint.Checkpoint:
    state = saved.state.copy()
    state[::7] = np.nan
    return checkpoint.Checkpoint(saved.round, saved.epoch, state, saved.meta)


def _far_future(saved: checkpoint.Checkpoint) -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(10**12, saved.epoch, saved.state, saved.meta)


DAMAGE: list[tuple[str, Callable[[Path], None], str]] = [
    ("truncated", _truncate, "unreadable"),
    ("bit-flipped", _flip_bits, "unreadable"),
    ("nan-parameters", _rewrite(_nan), "NaN or infinite"),
    ("round-10^12", _rewrite(_far_future), "round 1000000000000"),
]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=NODES) as b:
        yield b


def test_an_agent_restarted_on_each_kind_of_bad_checkpoint_rejoins(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = start_fleet(broker, tmp_path, NODES, {"rounds": 0})
    try:
        listener.wait_for(lambda: listener.reached(list(range(NODES)), 6), 180, "round 6")
        for kind, damage, reason in DAMAGE:
            _restart_on_damaged_checkpoint(fleet, listener, tmp_path, kind, damage, reason)
    except AssertionError:
        print(agent_logs(tmp_path))
        raise
    finally:
        forced = fleet.stop_all(grace=10)
        listener.close()
    assert forced == [], f"agents did not exit on SIGTERM: {forced}"


def _restart_on_damaged_checkpoint(fleet: Fleet, listener: FleetListener, tmp: Path, kind: str,
                                   damage: Callable[[Path], None], reason: str) -> None:
    saved = tmp / f"ckpt-{VICTIM}" / "checkpoint.npz"
    listener.wait_for(saved.exists, 120, f"a checkpoint of node {VICTIM} (before: {kind})")
    fleet.kill(VICTIM)
    listener.wait_for(lambda: listener.status.get(VICTIM) is not None
                      and listener.status[VICTIM].state == "offline", 30, "the Last Will")
    listener.wait_for(lambda: bool(listener.views) and VICTIM not in listener.views[-1].members,
                      60, f"a view without node {VICTIM}")
    damage(saved)
    log = tmp / f"agent-{VICTIM}.log"
    log_before = log.read_text()
    aside_before = len(list(saved.parent.glob("checkpoint.npz.corrupt-*")))
    fleet.spawn(VICTIM)
    listener.wait_for(lambda: bool(listener.views) and VICTIM in listener.views[-1].members,
                      120, f"node {VICTIM} back in the view after a {kind} checkpoint")
    rejoined = listener.views[-1].from_round
    listener.wait_for(lambda: _same_model_from(listener, rejoined), 120,
                      f"node {VICTIM} with the fleet's model hash after a {kind} checkpoint")
    assert fleet.agents[VICTIM].running(), f"node {VICTIM} died after a {kind} checkpoint"
    new_lines = log.read_text()[len(log_before):].splitlines()
    warnings = [line for line in new_lines if "set aside as checkpoint.npz.corrupt-" in line]
    assert len(warnings) == 1 and reason in warnings[0], (kind, warnings)
    assert not any("Traceback" in line for line in new_lines), kind
    assert len(list(saved.parent.glob("checkpoint.npz.corrupt-*"))) == aside_before + 1
    print(f"{kind}: set aside, back in view from round {rejoined}")


def _same_model_from(listener: FleetListener, start: int) -> bool:
    for r in range(start, start + 6):
        hashes = listener.hashes_at(r)
        if VICTIM in hashes and len(hashes) == NODES and len(set(hashes.values())) == 1:
            return True
    return False
