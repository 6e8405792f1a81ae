"""A stand-in fleet that drives the dashboard through a real broker, for tests and demos.

Each node is its own MQTT client with a retained ``online`` status and an ``offline`` Last
Will, the coordinator publishes the retained view, and every round every node sends a small
probe on ``link/<self>/<peer>`` to each tree and backup neighbour. A node judges a link by
whether the peer's probe of this round arrived THROUGH THE BROKER, so a link cut at the
broker (an ACL revoke) shows up exactly as an agent would report it: the tree link
``rerouted`` when the backup link still works (``failed`` otherwise), with ``timeout`` and
``reroute`` events. Loss and accuracy follow a plausible MNIST curve. It trains nothing: real
agents come from the fleet launcher (``simulate.fleet``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from agent.protocol.messages import Status, Telemetry, View
from agent.protocol.notes import NoteKind
from agent.protocol.topics import Topics
from agent.protocol.topology import Tree
from dashboard.settings import parse_broker_url

PROBE_BYTES = 64
DEMO_FINGERPRINT = "0123456789abcdef"  # the demo fleet's one model: a view must name it


@dataclass(frozen=True)
class NodeCredentials:
    username: str
    password: str
    client_id: str | None = None  # the one a dynamic-security broker binds to this user


def demo_labels(node: int, classes: int = 10) -> list[int]:
    """A non-IID shard for the page's label bars: most samples of two labels, a few of others."""
    return [600 if label in (node % classes, (node + 3) % classes) else 40 * ((label + node) % 3)
            for label in range(classes)]


class DemoNode:
    """One fake agent: its own connection, so the broker's ACL and Last Will apply to it."""

    def __init__(self, node: int, fleet: DemoFleet, creds: NodeCredentials | None) -> None:
        self.node = node
        self.fleet = fleet
        self.received: dict[int, set[int]] = defaultdict(set)  # round -> peers heard
        self.lock = threading.Lock()
        topics = fleet.topics
        client_id = creds.client_id if creds is not None and creds.client_id else f"demo-{fleet.job}-{node}"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        if creds is not None:
            self.client.username_pw_set(creds.username, creds.password)
        self.client.will_set(topics.status(node), Status(node, "offline").encode(), 1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message

    def start(self) -> None:
        address = parse_broker_url(self.fleet.url_for(self.node))
        self.client.connect(address.host, address.port, keepalive=5)
        self.client.loop_start()

    def _on_connect(self, client: mqtt.Client, *_args: object) -> None:
        topics = self.fleet.topics
        client.subscribe(topics.links_to(self.node), 0)
        status = Status(self.node, "online", pid=os.getpid(), incarnation=1, labels=demo_labels(self.node),
                        site=self.fleet.sites.get(self.node, ""), fingerprint=DEMO_FINGERPRINT)
        client.publish(topics.status(self.node), status.encode(), 1, retain=True)

    def _on_message(self, _c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
        parsed = self.fleet.topics.parse_link(message.topic)
        if parsed is None:
            return
        try:
            round_no = int(bytes(message.payload[:16]).decode().strip())
        except ValueError:
            return
        with self.lock:
            self.received[round_no].add(parsed[0])

    def probe(self, round_no: int, peers: Sequence[int]) -> None:
        payload = str(round_no).encode().ljust(PROBE_BYTES)
        for peer in peers:
            self.client.publish(self.fleet.topics.link(self.node, peer), payload, 0)

    def missing(self, round_no: int, peers: Sequence[int]) -> set[int]:
        with self.lock:
            return set(peers) - self.received.get(round_no, set())

    def heard(self, round_no: int) -> set[int]:
        with self.lock:
            heard = self.received.pop(round_no, set())
            for old in [r for r in self.received if r < round_no]:
                del self.received[old]
        return heard

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class DemoFleet:
    """``nodes`` fake agents in one process; ``run_rounds`` drives them round by round.

    With ``sites`` (node -> site) each node says its site and the tree is site-aware, as the
    agents'; ``broker_urls`` then names each node's own broker (its site's), else all use
    ``broker_url``."""

    def __init__(
        self,
        broker_url: str,
        job: str,
        nodes: int,
        arity: int = 2,
        credentials: dict[int, NodeCredentials] | None = None,
        round_window: float = 0.3,
        late_window: float = 2.0,
        eval_every: int = 2,
        sites: Mapping[int, str] | None = None,
        broker_urls: Mapping[int, str] | None = None,
    ) -> None:
        self.broker_url = broker_url
        self.sites = dict(sites or {})
        self.broker_urls = dict(broker_urls or {})
        self.job = job
        self.topics = Topics(job)
        self.tree = Tree.of(range(nodes), arity, sites=self.sites or None)
        self.round_window = round_window
        # A probe missing after the round's window gets this much longer before its link is
        # judged: a loaded host delays probes, and only a cut (which never delivers) pays it.
        self.late_window = late_window
        self.eval_every = eval_every
        self.round = 0
        creds = credentials or {}
        self.nodes = {i: DemoNode(i, self, creds.get(i)) for i in range(nodes)}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def url_for(self, node: int) -> str:
        return self.broker_urls.get(node, self.broker_url)

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()
        members = sorted(self.tree.members)
        sites = [self.sites[m] for m in members] if self.sites else []
        view = View(1, members, self.tree.arity, self.tree.root, 0, sites=sites, fingerprint=DEMO_FINGERPRINT)
        root = self.nodes[self.tree.root].client
        root.publish(self.topics.view_of(view.coordinator), view.encode(), 1, retain=True)

    def start_background(self) -> None:
        self.start()
        self._thread = threading.Thread(target=self._loop, name="demo-fleet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for node in self.nodes.values():
            node.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_round()

    def run_round(self) -> None:
        self.round += 1
        round_no = self.round
        for node_id, node in self.nodes.items():
            node.probe(round_no, sorted(self.tree.neighbours(node_id)))
        self._stop.wait(self.round_window)
        self._wait_for_late_probes(round_no)
        for node_id, node in self.nodes.items():
            telemetry = self._telemetry(node_id, round_no, node.heard(round_no))
            node.client.publish(self.topics.telemetry(node_id), telemetry.encode(), 0)

    def _wait_for_late_probes(self, round_no: int) -> None:
        deadline = time.monotonic() + self.late_window
        while not self._stop.is_set() and time.monotonic() < deadline:
            if not any(node.missing(round_no, sorted(self.tree.neighbours(node_id)))
                       for node_id, node in self.nodes.items()):
                return
            self._stop.wait(0.05)

    def _telemetry(self, node_id: int, round_no: int, heard: set[int]) -> Telemetry:
        links, events = self._judge_links(node_id, heard)
        timeouts = sum(1 for e in events if e["kind"] == NoteKind.TIMEOUT)
        reroutes = sum(1 for e in events if e["kind"] == NoteKind.REROUTE)
        loss = 2.3 * math.exp(-round_no / 12) + 0.06 + 0.02 * math.sin(round_no + node_id)
        accuracy = None
        if round_no % self.eval_every == 0:
            accuracy = min(0.985, 0.1 + 0.88 * (1 - math.exp(-round_no / 10)))
        total = 0.04 + 0.5 * timeouts
        return Telemetry(
            node=node_id, round=round_no, epoch=1, algorithm="ft-tree", wall_time=total,
            loss=round(loss, 4), accuracy=accuracy,
            phase_seconds={"compute": 0.02, "reduce": total - 0.03, "broadcast": 0.008,
                           "apply": 0.002, "total": total},
            bytes_sent=len(self.tree.neighbours(node_id)) * PROBE_BYTES,  # per round, as agents
            bytes_received=len(heard) * PROBE_BYTES,
            contributors=len(self.nodes), members=len(self.nodes), reroutes=reroutes,
            timeouts=timeouts, links=links, events=events,
            model_hash=f"{round_no * 2654435761 % 2**32:08x}",
        )

    def _judge_links(self, node_id: int, heard: set[int]) -> tuple[dict[str, str], list[dict[str, object]]]:
        tree = self.tree
        tree_peers = {p for p in (tree.parent(node_id), *tree.children(node_id)) if p is not None}
        backups = set(tree.backups(node_id))
        links: dict[str, str] = {}
        events: list[dict[str, object]] = []
        for peer in sorted(tree.neighbours(node_id)):
            if peer in heard:
                links[str(peer)] = "ok"
                continue
            events.append({"kind": NoteKind.TIMEOUT, "peer": peer, "detail": "no probe this round"})
            detour = next((b for b in sorted(backups) if b in heard and b != peer), None)
            if peer in tree_peers and detour is not None:
                links[str(peer)] = "rerouted"
                events.append({"kind": NoteKind.REROUTE, "peer": peer, "detail": f"via {detour}"})
            else:
                links[str(peer)] = "failed"
        return links, events
