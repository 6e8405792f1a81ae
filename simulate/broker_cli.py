"""``edgegrove broker``: run an MQTT broker for a job until Ctrl-C / SIGTERM.

mosquitto is rendered from broker-config/ (per-agent credentials, ACL, queue limits, dynamic
security) into a work directory; without mosquitto, the embedded rumqttd broker (MQTT 3.1.1,
no authentication) is started instead. Both listen on 127.0.0.1 unless --bind says otherwise.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from agent.protocol.topics import validate_job
from agent.validate import (
    EXIT_USAGE,
    UsageError,
    arg,
    bind_address,
    output_dir,
    port,
    whole,
)
from simulate.brokers import (
    BrokerError,
    EmbeddedBroker,
    MosquittoBroker,
    mosquitto_available,
    start_embedded,
    start_mosquitto,
)
from simulate.site_brokers import SiteBrokers, start_sites

DESCRIPTION = (
    "Run an MQTT broker for a job until Ctrl-C / SIGTERM: mosquitto from broker-config/ with "
    "per-agent credentials, ACL and dynamic security, or (without mosquitto) the embedded "
    "rumqttd broker. Prints the URL and where the credentials are."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=["auto", "mosquitto", "embedded"], default="auto",
                        help="auto: mosquitto when installed, else the embedded rumqttd broker")
    parser.add_argument("--port", type=arg(port), default=0, help="TCP port (0: a free one)")
    parser.add_argument("--bind", type=arg(bind_address), default="127.0.0.1",
                        help="listen address; 0.0.0.0 to serve devices on the network")
    parser.add_argument("--nodes", type=arg(whole(1, 1024, "a number of agents")), default=7,
                        help="agents to create credentials for (ids 0..N-1; mosquitto only)")
    parser.add_argument("--job", type=arg(_job), default="default", help="job name (topic prefix edgegrove/JOB)")
    parser.add_argument("--workdir", type=arg(output_dir), default=None,
                        help="where configs, credentials.json and the log go (default: a new "
                             "temporary directory, kept after exit)")
    parser.add_argument("--no-dynsec", action="store_true",
                        help="mosquitto: passwd/acl files instead of the dynamic-security plugin")
    parser.add_argument("--tls", action="store_true",
                        help="mosquitto: TLS listener with a throw-away CA (with dynamic security "
                             "unless --no-dynsec)")
    parser.add_argument("--sites", type=arg(whole(1, 64, "a number of sites")), default=None,
                        help="mosquitto: one broker per site plus a core broker, joined by "
                             "bridges (broker-config/make-sites); agents split by id")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document (url, kind, credentials path) on stdout")


def _job(text: str) -> str:
    try:
        return validate_job(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_kind(args: argparse.Namespace) -> str:
    """The broker to start (auto resolved), or UsageError when it cannot be that one."""
    kind = str(args.kind)
    if kind == "auto":
        kind = "mosquitto" if mosquitto_available() else "embedded"
    elif kind == "mosquitto" and not mosquitto_available():
        raise UsageError("--kind mosquitto: mosquitto is not installed: install it "
                         "(apt-get install mosquitto) or use --kind embedded")
    if kind == "embedded" and (args.tls or args.no_dynsec):
        flag = "--tls" if args.tls else "--no-dynsec"
        raise UsageError(f"{flag} is for mosquitto; the embedded broker has no TLS and no "
                         "authentication: install mosquitto or drop the flag")
    if args.sites is not None:
        _check_sites(args, kind)
    return kind


def _check_sites(args: argparse.Namespace, kind: str) -> None:
    if kind != "mosquitto":
        raise UsageError("--sites needs mosquitto (its bridges): install it (apt-get install "
                         "mosquitto)")
    if args.tls or args.port or args.bind != "127.0.0.1":
        raise UsageError("--sites runs every broker on free ports of 127.0.0.1 without TLS, for "
                         "tests and trials: drop --tls, --port and --bind (broker-config/make-sites "
                         "writes a real deployment)")
    if args.sites > args.nodes:
        raise UsageError(f"--sites {args.sites} is more than --nodes {args.nodes}: every site "
                         "needs an agent")


def _start(args: argparse.Namespace) -> MosquittoBroker | EmbeddedBroker | SiteBrokers:
    if check_kind(args) == "embedded":
        return start_embedded(port=args.port or None, host=args.bind)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="edgegrove-broker-"))
    if args.sites is not None:
        return start_sites(workdir, job=args.job, nodes=args.nodes, sites=args.sites)
    return start_mosquitto(workdir, job=args.job, nodes=args.nodes, port=args.port or None,
                           dynsec=not args.no_dynsec, tls=args.tls, bind=args.bind)


def describe(broker: MosquittoBroker | EmbeddedBroker | SiteBrokers) -> dict[str, Any]:
    if isinstance(broker, SiteBrokers):
        return {"kind": "mosquitto-sites", "url": broker.core.url,
                "credentials": str(broker.credentials_path), "job": broker.job,
                "pid": broker.core.pid,
                "sites": {name: {"url": b.url, "ids": broker.plan[name], "pid": b.pid}
                          for name, b in broker.sites.items()}}
    if isinstance(broker, EmbeddedBroker):
        return {"kind": "embedded", "url": broker.url, "credentials": None, "pid": broker.pid}
    return {"kind": "mosquitto", "url": broker.url, "credentials": str(broker.credentials_path),
            "ca_file": broker.ca_file, "dynsec": broker.dynsec, "log": str(broker.log_path),
            "job": broker.job, "pid": broker.pid}


def run(args: argparse.Namespace) -> int:
    try:
        check_kind(args)
    except UsageError as exc:
        print(f"edgegrove broker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        broker = _start(args)
    except (BrokerError, ValueError, OSError) as exc:
        print(f"edgegrove broker: {exc}", file=sys.stderr)
        return 1
    with broker:
        info = describe(broker)
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            print(f"broker ({info['kind']}) listening at {info['url']}", flush=True)
            for name, site in info.get("sites", {}).items():
                print(f"site {name} (agents {site['ids'][0]}-{site['ids'][-1]}) at {site['url']}, "
                      "bridged to the core", flush=True)
            if info["credentials"]:
                print(f"credentials (agents, dashboard, admin): {info['credentials']}", flush=True)
            else:
                print("no authentication: keep it on 127.0.0.1 or a trusted network", flush=True)
        print("Ctrl-C or SIGTERM stops it", file=sys.stderr)
        while not stop.wait(0.5):
            if not broker.is_running:
                print("edgegrove broker: the broker process exited; see its log", file=sys.stderr)
                return 1
    return 0
