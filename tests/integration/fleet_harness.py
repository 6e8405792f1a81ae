"""A real fleet for integration tests: agent processes on a real broker, and a listener that
reads their status, view and telemetry the way the dashboard does."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.protocol.keys import MemberKeys, key_bytes, ring_of
from agent.protocol.messages import MessageError, Status, Telemetry, View
from agent.protocol.topics import Topics
from agent.transport.mqtt import MqttTransport
from simulate.fleet import AgentSpec, Fleet

FAST_AGENT = {
    "eval_every": 0,
    "eval_samples": 1000,
    "round_deadline": 3.0,
    "timeout": 0.5,
    "join_grace": 20.0,
    "checkpoint_every": 5,
}


class FleetListener:
    def __init__(self, url: str, job: str, username: str | None = None,
                 password: str | None = None) -> None:
        self.topics = Topics(job)
        self.transport = MqttTransport(f"test-listener-{time.monotonic_ns()}", url,
                                       username=username, password=password)
        self.telemetry: dict[int, list[Telemetry]] = defaultdict(list)
        self.status: dict[int, Status] = {}
        self.views: list[View] = []
        self.transport.connect([self.topics.all_status(), self.topics.all_views(),
                                self.topics.all_telemetry()])

    def pump(self, timeout: float = 0.1) -> None:
        for message in self.transport.receive(timeout):
            try:
                if (node := self.topics.parse_telemetry(message.topic)) is not None:
                    self.telemetry[node].append(Telemetry.decode(message.payload))
                elif self.topics.parse_status(message.topic) is not None:
                    status = Status.decode(message.payload)
                    self.status[status.node] = status
                elif self.topics.is_view(message.topic):
                    self.views.append(View.decode(message.payload))
            except MessageError:
                pass

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; "
                                     f"last rounds: {self.last_rounds()}, views: {self.views[-2:]}")
            self.pump(0.2)

    def last_rounds(self) -> dict[int, int]:
        return {n: t[-1].round for n, t in self.telemetry.items() if t}

    def last(self, node: int) -> Telemetry:
        return self.telemetry[node][-1]

    def reached(self, nodes: list[int], round_: int) -> bool:
        return all(self.telemetry[n] and self.telemetry[n][-1].round >= round_ for n in nodes)

    def hashes_at(self, round_: int) -> dict[int, str]:
        """Model hash after round ``round_`` per node that reported it."""
        return {n: t.model_hash for n, ts in self.telemetry.items() for t in ts if t.round == round_}

    def events(self, node: int, kind: str) -> list[dict[str, Any]]:
        return [e for t in self.telemetry[node] for e in t.events if e.get("kind") == kind]

    def close(self) -> None:
        self.transport.close()


def start_fleet(broker: Any, tmp: Path, nodes: int, options: dict[str, Any]) -> Fleet:
    """Agents 0..nodes-1 against ``broker`` (credentials from its credentials.json if any)."""
    specs = []
    for node in range(nodes):
        opts = {"job": broker_job(broker), "fleet_size": nodes, **FAST_AGENT, **options}
        if getattr(broker, "credentials_path", None) is not None:
            opts["credentials"] = str(broker.credentials_path)
        specs.append(AgentSpec(node=node, broker_url=broker.url, options=opts,
                               checkpoint_dir=tmp / f"ckpt-{node}", log_path=tmp / f"agent-{node}.log"))
    fleet = Fleet(specs)
    fleet.start_all()
    return fleet


def second_session(broker: Any, node: int) -> MqttTransport:
    """A second connection with ``node``'s credentials: what that device sends when it is
    compromised (the broker's client-id binding must be off to let both connect)."""
    creds = broker.credentials_for(node)
    transport = MqttTransport(f"edgegrove-{broker_job(broker)}-{node}-evil", broker.url,
                              username=creds.username, password=creds.password)
    transport.connect([])
    return transport


def device_keys(broker: Any, node: int) -> MemberKeys:
    """``node``'s device key and the job's ring, as make-credentials wrote them: what a
    compromised device signs its own messages with."""
    doc = json.loads(Path(broker.credentials_path).read_text())
    private = key_bytes(doc["agents"][str(node)]["device_key"])
    assert private is not None, "make-credentials wrote no device key (cryptography missing?)"
    return MemberKeys.of_private(node, private, ring_of(doc["member_keys"]))


def wait_exited(fleet: Fleet, timeout: float) -> None:
    """Agents with a round budget stop by themselves; wait for that (by handle)."""
    deadline = time.monotonic() + timeout
    while fleet.running_nodes():
        if time.monotonic() > deadline:
            raise AssertionError(f"agents {fleet.running_nodes()} still running {timeout:.0f} s "
                                 "after their last round")
        time.sleep(0.1)


def fleet_job_hash(job: str, model: str = "mlp", seed: int = 0) -> int:
    """The job field of the frames of a fleet that trains ``model`` from ``seed`` (the agents'
    defaults): the job name and the model's fingerprint (wire.job_hash)."""
    from agent.model.contract import fingerprint
    from agent.model.loader import load_model
    from agent.protocol.wire import job_hash

    return job_hash(job, fingerprint(load_model(model), seed))


def broker_job(broker: Any) -> str:
    return str(getattr(broker, "job", "itest"))


def agent_logs(tmp: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp.glob("agent-*.log")))
