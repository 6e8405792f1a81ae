"""The embedded pure-Python MQTT 3.1.1 broker (amqtt), for demos where mosquitto is absent.

    python -m simulate.embedded_broker [--host 127.0.0.1] [--port 0]

Prints ``READY mqtt://HOST:PORT`` on stdout once it accepts connections (port 0 picks a free
one), then serves until SIGTERM/SIGINT. No authentication, no ACL, no queue limits: publishers
must pace themselves (MqttTransport's max_publish_bytes_per_s).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any


def broker_config(host: str, port: int) -> dict[str, Any]:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        # Only anonymous auth: the packet/event logger plugins cost time on every message.
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def serve(host: str, port: int) -> None:
    from amqtt.broker import Broker

    broker = Broker(broker_config(host, port))
    await broker.start()
    actual_port = broker._servers["default"].instance.sockets[0].getsockname()[1]
    print(f"READY mqtt://{host}:{actual_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", default=0, type=int, help="port (0: a free one)")
    parser.add_argument("--log-level", default="WARNING", help="amqtt's log level")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        asyncio.run(serve(args.host, args.port))
    except OSError as exc:
        print(f"embedded broker: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
