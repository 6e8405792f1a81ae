"""The MQTT side of the dashboard: a paho client on its own network thread.

paho (callback API version 2) runs its loop in a thread and reconnects by itself (with
backoff, and ``connect_async`` so that a broker that is not up yet is retried too). Every
message is handed to the asyncio loop through a bounded queue and reduced there, so the
reducer and the web handlers never share state across threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from agent.protocol.messages import MAX_MESSAGE_BYTES
from dashboard.directory import SUBSCRIPTIONS as DIRECTORY_TOPICS
from dashboard.settings import DashboardSettings, parse_broker_url
from dashboard.store import FleetStore

log = logging.getLogger(__name__)

QUEUE_LIMIT = 10_000
TICK_SECONDS = 1.0

Item = tuple[str, bytes | None]  # None: the payload was too large to even queue


class BrokerUnavailable(RuntimeError):
    """Publishing is impossible right now (not connected, or the client refused)."""


class MqttListener:
    def __init__(self, settings: DashboardSettings, store: FleetStore) -> None:
        if settings.broker_url is None:
            raise ValueError("the MQTT listener needs a broker URL")
        self.settings = settings
        self.store = store
        self.address = parse_broker_url(settings.broker_url)
        self.connected = False
        self.last_error = ""
        self.connects = 0
        self._queue: asyncio.Queue[Item] = asyncio.Queue(maxsize=QUEUE_LIMIT)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        client_id = settings.client_id or f"edgegrove-dashboard-{uuid.uuid4().hex[:8]}"
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        if settings.username is not None:
            self._client.username_pw_set(settings.username, settings.password)
        if self.address.tls:
            self._client.tls_set(ca_certs=str(settings.ca_file) if settings.ca_file else None)
        self._client.reconnect_delay_set(min_delay=1, max_delay=5)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._consume(), name="dashboard-mqtt-consume"),
            asyncio.create_task(self._tick(), name="dashboard-tick"),
        ]
        self._client.connect_async(self.address.host, self.address.port, keepalive=15)
        self._client.loop_start()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._client.disconnect()
        await asyncio.to_thread(self._client.loop_stop)

    def publish(self, topic: str, payload: bytes) -> None:
        if not self.connected:
            raise BrokerUnavailable(f"not connected to the broker at {self.settings.broker_url}")
        info = self._client.publish(topic, payload, qos=1)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise BrokerUnavailable(f"publish refused: {mqtt.error_string(info.rc)}")

    # -- paho callbacks (network thread) ---------------------------------------------

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            self.last_error = f"connect refused: {reason}"
            log.warning("dashboard: broker refused the connection: %s", reason)
            return
        self.connected = True
        self.connects += 1
        self.last_error = ""
        topics = self.store.topics
        client.subscribe([(topics.all_status(), 1), (topics.all_views(), 1), (topics.view, 1),
                          (topics.all_telemetry(), 0), (topics.all_bridges(), 1),
                          *((device_or_job, 1) for device_or_job in DIRECTORY_TOPICS)])

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        self.connected = False
        if reason.is_failure:
            self.last_error = f"disconnected: {reason}"

    def _on_message(self, _c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        payload: bytes | None = bytes(message.payload)
        if payload is not None and len(payload) > MAX_MESSAGE_BYTES:
            payload = None  # never queue megabytes that decode would reject anyway
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed under our feet
                loop.call_soon_threadsafe(self._enqueue, (message.topic, payload))

    # -- event loop side ---------------------------------------------------------------

    def _enqueue(self, item: Item) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self._count("overload")

    def _count(self, reason: str) -> None:
        self.store.count_malformed(reason)

    async def _consume(self) -> None:
        while True:
            topic, payload = await self._queue.get()
            try:
                if payload is None:
                    self._count("too_large")
                else:
                    self.store.ingest(topic, payload)
            except Exception:  # a reducer bug must not stop the dashboard: count and go on
                log.exception("dashboard: reducing a message on %s failed", topic)
                self._count("internal_error")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            self.store.tick()


ListenerFactory = Callable[[DashboardSettings, FleetStore], MqttListener]
