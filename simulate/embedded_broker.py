"""The embedded MQTT broker, for demos and tests where mosquitto is absent: rumqttd (a compiled,
multi-threaded broker, shipped in the ``iotcore`` wheel), anonymous, plain TCP.

    python -m simulate.embedded_broker [--host 127.0.0.1] [--port 0]

Prints ``READY mqtt://HOST:PORT`` on stdout once it accepts connections (port 0 picks a free
one), then serves until SIGTERM/SIGINT. No authentication, no ACL.

Why not a pure-Python broker (amqtt, which this was): every byte of every agent passed through
one Python thread. On a host running other work (load 10+ on 2 cores) that thread got a small
share of a core, rounds of a 7-agent fleet ran to their deadline and the failure detector took
starved agents for silent ones; amqtt also lost a client now and then to a race between one
client's connect and another's subscribe ("dictionary changed size during iteration"), after
which that client's frames went nowhere.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

# MQTT frames are chunks (64 KB by default), and an unchunked model of the thesis MLP is 1.6 MB:
# the same packet limit as broker-config/mosquitto.conf.
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
# rumqttd keeps what it routes in a log per subscription filter: a ring of segments. A
# subscriber further behind than the ring loses the oldest frames (QoS 0: a lost frame, which
# the fleet tolerates) instead of growing the broker's memory without bound, like mosquitto's
# max_queued_bytes.
SEGMENT_BYTES = 4 * 1024 * 1024
SEGMENT_COUNT = 4
READY_TIMEOUT_S = 15.0
PORT_TRIES = 5


def broker_config(host: str, port: int) -> str:
    """rumqttd's TOML: one MQTT 3.1.1 listener, no console, no metrics."""
    return f"""id = 0

[router]
id = 0
max_connections = 1000
max_outgoing_packet_count = 200
max_segment_size = {SEGMENT_BYTES}
max_segment_count = {SEGMENT_COUNT}

[v4.1]
name = "v4-1"
listen = "{host}:{port}"
next_connection_delay_ms = 1
[v4.1.connections]
connection_timeout_ms = 60000
max_payload_size = {MAX_PAYLOAD_BYTES}
max_inflight_count = 100
dynamic_filters = true
"""


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _serve_in_thread(host: str, port: int, workdir: Path) -> tuple[threading.Thread, list[BaseException]]:
    """rumqttd's run_forever blocks (and releases the GIL): it runs in a daemon thread, and
    the process ends it by exiting. A listener it cannot bind ends the thread with OSError."""
    from iotcore.iotcore import IotCoreBroker

    config = workdir / f"rumqttd-{port}.toml"
    config.write_text(broker_config(host, port))
    failed: list[BaseException] = []

    def run() -> None:
        try:
            IotCoreBroker(config_path=str(config)).run_forever()
        except BaseException as exc:  # reported by the main thread
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="rumqttd")
    thread.start()
    return thread, failed


def start(host: str, port: int, workdir: Path) -> int:
    """Start the broker; return the port it listens on once it accepts connections. Port 0
    picks a free one (tried again if another process takes it first)."""
    last: BaseException | None = None
    for _ in range(PORT_TRIES if port == 0 else 1):
        chosen = port or _free_port(host)
        thread, failed = _serve_in_thread(host, chosen, workdir)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and thread.is_alive() and not failed:
            if _accepts(host, chosen):
                return chosen
            time.sleep(0.05)
        last = failed[0] if failed else OSError(f"not listening after {READY_TIMEOUT_S:.0f} s")
    assert last is not None
    raise OSError(str(last))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", default=0, type=int, help="port (0: a free one)")
    parser.add_argument("--log-level", default="WARNING", help="the broker's log level")
    args = parser.parse_args(argv)
    level = args.log_level.upper()
    logging.basicConfig(level=level, stream=sys.stderr)
    # rumqttd logs every routed packet inside an error span: only when asked for debugging.
    logging.getLogger("rumqttd").setLevel(logging.DEBUG if level == "DEBUG" else logging.CRITICAL)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="edgegrove-broker-") as workdir:
        try:
            port = start(args.host, args.port, Path(workdir))
        except ImportError:
            print("embedded broker: the iotcore package (rumqttd) is not installed: pip install "
                  "'edgegrove[simulate]', or install mosquitto (no iotcore wheel for Linux on "
                  "ARM)", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"embedded broker: {exc}", file=sys.stderr)
            return 1
        print(f"READY mqtt://{args.host}:{port}", flush=True)
        while not stop.wait(1.0):
            pass
    sys.stdout.flush()
    os._exit(0)  # the broker thread has no shutdown: leave without waiting for it


if __name__ == "__main__":
    sys.exit(main())
