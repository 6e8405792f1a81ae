"""The operator's MQTT connection: read the retained state of the fleet, publish retained.

A snapshot of retained topics ends when a marker we publish after subscribing comes back:
the broker sends a subscription's retained messages before anything published later, so
nothing retained is missed and nobody waits for a quiet period (unless the marker cannot be
written, then a short quiet period ends it).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.jobs.topics import ROOT
from agent.operator.fleet import FleetView
from agent.transport.base import Message, TransportError
from agent.transport.mqtt import MqttTransport
from agent.validate import arg, broker_url, input_file

SNAPSHOT_TIMEOUT_S = 10.0
QUIET_S = 1.0
CREDENTIAL_ENTRIES = ("operator", "admin")
Run = Callable[[argparse.Namespace], int]


class OperatorError(Exception):
    """What keeps an operator's command from going on, one line (exit 2)."""


@dataclass(frozen=True)
class BrokerLogin:
    url: str
    username: str | None = None
    password: str | None = None
    tls_ca: str | None = None


def add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker (defaults from EDGEGROVE_BROKER, _USERNAME, _PASSWORD, "
                                      "_CREDENTIALS, _TLS_CA)")
    group.add_argument("--broker", type=arg(broker_url),
                       default=os.environ.get("EDGEGROVE_BROKER", "mqtt://127.0.0.1:1883"),
                       help="the fleet's broker, mqtt:// or mqtts://")
    group.add_argument("--username", default=os.environ.get("EDGEGROVE_USERNAME"),
                       help="the operator's MQTT user")
    group.add_argument("--password", default=os.environ.get("EDGEGROVE_PASSWORD"),
                       help="its password")
    group.add_argument("--credentials", type=arg(input_file), default=os.environ.get("EDGEGROVE_CREDENTIALS"),
                       help="credentials.json of broker-config/make-credentials: its operator "
                            "(else admin) entry gives user and password")
    group.add_argument("--tls-ca", type=arg(input_file), default=os.environ.get("EDGEGROVE_TLS_CA"),
                       help="CA certificate for mqtts://")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def login_from_args(args: argparse.Namespace) -> BrokerLogin:
    username, password = args.username, args.password
    if username is None and args.credentials is not None:
        username, password = _from_credentials(Path(args.credentials))
    tls_ca = str(args.tls_ca) if args.tls_ca else None
    return BrokerLogin(str(args.broker), username, password, tls_ca)


def _from_credentials(path: Path) -> tuple[str, str]:
    try:
        table = json.loads(path.read_text())
        for name in CREDENTIAL_ENTRIES:
            entry = table.get(name)
            if isinstance(entry, dict) and isinstance(entry.get("username"), str):
                return entry["username"], str(entry.get("password", ""))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise OperatorError(f"credentials file {path} cannot be read: {exc}") from None
    raise OperatorError(f"credentials file {path} has no operator or admin entry with a username")


def one_line_errors(prog: str) -> Callable[[Run], Run]:
    """A command's ``run`` whose OperatorError ends it as one line on stderr, exit code 2."""
    def guard(run: Run) -> Run:
        @functools.wraps(run)
        def guarded(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except OperatorError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
        return guarded
    return guard


def fleet_snapshot(args: argparse.Namespace, filters: list[str]) -> FleetView:
    """The retained state of ``filters`` on the broker of the command's options
    (add_broker_arguments), read over one short connection."""
    with OperatorClient(login_from_args(args), filters) as client:
        return FleetView().take_all(client.sync())


def marker_topic(client_id: str) -> str:
    """Where a client's sync marker goes: the operator's ACL must let it write and read there
    (broker-config/acl.template), or each snapshot waits out a quiet period."""
    return f"{ROOT}/operator/{client_id}/sync"


class OperatorClient:
    """One connection of the operator's, for one command."""

    def __init__(self, login: BrokerLogin, subscriptions: list[str]) -> None:
        self.client_id = f"edgegrove-operator-{uuid.uuid4().hex[:10]}"
        self._marker_topic: str | None = marker_topic(self.client_id)
        try:
            self._transport = self._connected(login, [*subscriptions, self._marker_topic])
        except TransportError as exc:
            if "refused the subscription" not in str(exc):
                raise OperatorError(str(exc)) from None
            # The ACL keeps us from the marker (or from what we asked): go on without it.
            self._marker_topic = None
            try:
                self._transport = self._connected(login, subscriptions)
            except TransportError as again:
                raise OperatorError(str(again)) from None

    def _connected(self, login: BrokerLogin, subscriptions: list[str]) -> MqttTransport:
        transport = MqttTransport(self.client_id, login.url, username=login.username,
                                  password=login.password, tls_ca=login.tls_ca)
        transport.connect(subscriptions)
        return transport

    def __enter__(self) -> OperatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    def publish(self, topic: str, payload: bytes, retain: bool = True) -> None:
        try:
            self._transport.publish(topic, payload, retain=retain, reliable=True)
        except TransportError as exc:
            raise OperatorError(str(exc)) from None

    def sync(self, timeout: float = SNAPSHOT_TIMEOUT_S) -> list[Message]:
        """Everything that arrived until the broker has handled all we sent before (the
        marker is back; without a marker, a quiet period): the retained state of our
        subscriptions, our publishes done."""
        marker = uuid.uuid4().hex.encode()
        if self._marker_topic is not None:
            self.publish(self._marker_topic, marker, retain=False)
        got: list[Message] = []
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while (left := deadline - time.monotonic()) > 0:
            batch = self._transport.receive(min(left, 0.1))
            for message in batch:
                if message.topic == self._marker_topic and message.payload == marker:
                    return got
                if message.notice is None and message.topic != self._marker_topic:
                    got.append(message)
            if batch:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > (QUIET_S if self._marker_topic is None else 3 * QUIET_S):
                break  # no marker (or it was dropped): nothing more is coming
        return got

    def messages(self, until: float) -> Iterator[Message]:
        """What arrives until the monotonic time ``until`` (``inf``: until interrupted)."""
        while (left := until - time.monotonic()) > 0:
            for message in self._transport.receive(min(left, 1.0)):
                if message.notice is None and (self._marker_topic is None or message.topic != self._marker_topic):
                    yield message


def retained(messages: list[Message]) -> dict[str, bytes]:
    """Topic -> its latest non-empty payload (an empty retained message clears a topic)."""
    out: dict[str, bytes] = {}
    for message in messages:
        if message.payload:
            out[message.topic] = message.payload
        else:
            out.pop(message.topic, None)
    return out
