"""Issue 16: a second agent started with another's id and credentials. On a broker that binds
client ids to credentials the two share one client id, so mosquitto hands the session from
one to the other on every connect; the older agent must see the newer one and stop with a
clear error (exit code 4) instead of fighting for the session, and the fleet trains on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.runtime import DISPLACED_EXIT
from simulate.brokers import start_mosquitto
from simulate.fleet import AgentSpec, Fleet
from tests.integration.fleet_harness import FAST_AGENT, FleetListener, agent_logs, start_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "twins"
NODES = 3
ROUNDS = 0  # until stopped: a 3-agent fleet's rounds are short, the newer one must catch it
TWIN = 2


def test_an_agent_whose_id_is_taken_by_a_newer_one_stops_and_the_fleet_trains_on(tmp_path: Path) -> None:
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=NODES) as broker:
        creds = broker.dashboard_credentials
        listener = FleetListener(broker.url, JOB, creds.username, creds.password)
        fleet = start_fleet(broker, tmp_path, NODES, {"rounds": ROUNDS, "eval_every": 0})
        options = {"job": JOB, "fleet_size": NODES, **FAST_AGENT, "rounds": ROUNDS, "eval_every": 0,
                   "credentials": str(broker.credentials_path)}
        twin = Fleet([AgentSpec(node=TWIN, broker_url=broker.url, options=options,
                                checkpoint_dir=tmp_path / "ckpt-twin", log_path=tmp_path / "agent-twin.log")])
        try:
            listener.wait_for(lambda: listener.reached(list(range(NODES)), 5), 120, "round 5")
            twin.start_all()
            deadline = time.monotonic() + 60
            while fleet.agents[TWIN].running():
                assert time.monotonic() < deadline, f"the older node {TWIN} never stopped\n{agent_logs(tmp_path)}"
                listener.pump(0.2)
            assert fleet.agents[TWIN].popen is not None
            assert fleet.agents[TWIN].popen.returncode == DISPLACED_EXIT, agent_logs(tmp_path)
            log = (tmp_path / f"agent-{TWIN}.log").read_text()
            assert f"runs as node {TWIN} with these credentials: stopping this one" in log
            assert "Traceback" not in log
            assert twin.agents[TWIN].running(), (tmp_path / "agent-twin.log").read_text()
            # The newer agent (no checkpoint) rejoins: a later round with all three nodes and
            # one model hash.
            since = listener.last(0).round
            listener.wait_for(lambda: _together_after(listener, since), 120,
                              f"node {TWIN}'s newer agent training with the fleet")
        finally:
            forced = fleet.stop_all(grace=10) + twin.stop_all(grace=10)
            listener.close()
        assert forced == [], agent_logs(tmp_path)


def _together_after(listener: FleetListener, since: int) -> bool:
    last = min(listener.last_rounds().values(), default=-1)
    for r in range(since + 1, last + 1):
        hashes = listener.hashes_at(r)
        if len(hashes) == NODES and len(set(hashes.values())) == 1:
            return True
    return False
