"""`edgegrove dashboard`: serve the live fleet dashboard of one job."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.settings import DashboardSettings

DESCRIPTION = (
    "Serve the live dashboard of one Edgegrove job: it subscribes to the job's status, view "
    "and telemetry topics on the broker and serves the page, a REST API (/api/fleet, "
    "/api/rounds, /api/events, /api/incidents, /metrics for Prometheus, docs at /docs) and a WebSocket. Fault controls "
    "are enabled only with --control-token. With --replay RUN_DIR it serves a finished "
    "simulator run instead, with the same page, charts, incidents and timeline."
)
TOKEN_ENV = "EDGEGROVE_CONTROL_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_broker_arguments(parser.add_argument_group("broker", "the job's broker, and as whom to connect"))
    _add_server_arguments(parser.add_argument_group(
        "server", "who may reach the page and the API, and who may control the fleet"))
    _add_history_arguments(parser.add_argument_group(
        "history", "what the dashboard keeps and writes, or which finished run it replays"))


def _add_broker_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument("--broker", default="mqtt://127.0.0.1:1883",
                        help="MQTT broker URL, mqtt://HOST:PORT (mqtts:// for TLS)")
    parser.add_argument("--ca-file", type=Path, default=None, metavar="FILE",
                        help="with an mqtts:// broker: the CA certificate that signed its certificate "
                             "(default: the system's CAs)")
    parser.add_argument("--job", default="default", help="the job whose topics to follow")
    parser.add_argument("--topic-prefix", default="",
                        help="topic prefix, if the job does not use edgegrove/<job>")
    parser.add_argument("--username", help="MQTT user name (with --password)")
    parser.add_argument("--password", help="MQTT password (prefer --credentials FILE)")
    parser.add_argument("--credentials", type=Path, metavar="FILE",
                        help="file with the MQTT credentials: the job's credentials.json "
                             "written by broker-config/make-credentials (its read-only dashboard "
                             "entry, or its dashboard_control entry when controls are on: that "
                             "user may also publish on the job's control topic, nothing else), "
                             "JSON {\"username\": ..., \"password\": ...}, "
                             "or one line USER:PASSWORD")


def _add_server_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; 0.0.0.0 exposes the dashboard to the network")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port; 0 picks a free one")
    parser.add_argument("--control-token", default=None,
                        help=f"enable fault controls for clients sending this bearer token "
                             f"(at least 8 characters; default: ${TOKEN_ENV}, else disabled)")
    parser.add_argument("--accounts", type=Path, metavar="FILE",
                        help="named operator accounts (`edgegrove accounts add` writes the file): "
                             "reading the page needs a login, commands the operator role")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="also let pages from this origin (http(s)://HOST[:PORT]) open the "
                             "WebSocket; the dashboard's own host is always allowed (repeatable)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests whose Host is NAME (a DNS name the dashboard is "
                             "reached by); the bind address, localhost and IP addresses always "
                             "work; '*' answers any name (repeatable)")
    parser.add_argument("--max-websockets", type=int, default=32,
                        help="WebSocket connections served at once; more are refused")
    parser.add_argument("--url-file", type=Path, metavar="PATH",
                        help="also write the dashboard's URL to this file once it listens")


def _add_history_arguments(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument("--event-log", type=Path, metavar="PATH",
                        help="append every event of the timeline to this JSON-lines file")
    parser.add_argument("--max-rounds", type=int, default=2000,
                        help="latest rounds pushed live to the page (the server keeps every round; "
                             "the page loads earlier ones from /api/rounds)")
    parser.add_argument("--max-events", type=int, default=2000,
                        help="latest events kept in the fleet state (/api/events serves the "
                             "whole history, paged)")
    parser.add_argument("--max-node-points", type=int, default=4096,
                        help="rounds of each node's own series (round time, CPU, memory, bytes) kept "
                             "for the charts' per-node view (default: 4096)")
    parser.add_argument("--hung-after", type=float, default=15.0,
                        help="seconds without telemetry, while the fleet moves on, before a node "
                             "is shown as hung (suspected after a third of it)")
    parser.add_argument("--replay", type=Path, metavar="RUN_DIR",
                        help="serve a finished `edgegrove simulate` run (its directory, with "
                             "events.jsonl) instead of following a broker")
    parser.add_argument("--run-dir", type=Path, metavar="RUN_DIR",
                        help="the live run's directory: the page shows the tail of its "
                             "agents/agent-N.log (a --replay reads its own run's)")


def read_credentials(path: Path, role: str = "dashboard") -> tuple[str, str]:
    """USER:PASSWORD, JSON {"username", "password"}, or a job's credentials.json (``role``).

    Raises ValueError that says what is wrong with the file.
    """
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read the credentials file {path}: {exc.strerror}") from None
    if text.startswith("{"):
        try:
            data = json.loads(text)
            entry = data[role] if role in data and "username" not in data else data
            return str(entry["username"]), str(entry["password"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(
                f"{path}: expected JSON with \"username\" and \"password\" keys, or a job's "
                f"credentials.json with a \"{role}\" entry"
            ) from None
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise ValueError(f"{path}: expected one line USER:PASSWORD (or a JSON object)")
    return user, password


def _check_files(args: argparse.Namespace) -> None:
    """The files and directories the options name exist and read (ValueError says which not)."""
    if args.replay is not None:
        from dashboard.replay import check_run_dir

        check_run_dir(args.replay)
    if args.run_dir is not None and not args.run_dir.is_dir():
        raise ValueError(f"--run-dir {args.run_dir}: no such directory")
    if args.accounts is not None:
        from dashboard.accounts import load_accounts

        if not load_accounts(args.accounts):
            raise ValueError(f"--accounts {args.accounts}: no account in it (`edgegrove accounts add`)")
    if args.ca_file is not None and not args.ca_file.is_file():
        raise ValueError(f"--ca-file {args.ca_file}: no such file")


def settings_from_args(args: argparse.Namespace) -> DashboardSettings:
    from dashboard.settings import DashboardSettings

    username, password = args.username, args.password
    token = args.control_token or os.environ.get(TOKEN_ENV) or None
    if args.credentials is not None:
        acting = token or args.accounts is not None  # only dashboard-control may publish on control
        username, password = read_credentials(args.credentials, "dashboard_control" if acting else "dashboard")
    if password is not None and username is None:
        raise ValueError("--password needs --username")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: a port is 0-65535 (0 picks a free one)")
    _check_files(args)
    return DashboardSettings(
        broker_url=args.broker,
        ca_file=args.ca_file,
        job=args.job,
        topic_prefix=args.topic_prefix,
        username=username,
        password=password,
        host=args.host,
        port=args.port,
        control_token=None if args.replay is not None else token,
        event_log=args.event_log,
        max_rounds=args.max_rounds,
        max_events=args.max_events,
        max_node_points=args.max_node_points,
        hung_after=args.hung_after,
        suspect_after=args.hung_after / 3,
        replay=args.replay,
        run_dir=args.run_dir,
        allowed_origins=tuple(args.allow_origin),
        allowed_hosts=tuple(args.allow_host),
        max_websockets=args.max_websockets,
        accounts_file=None if args.replay is not None else args.accounts,
    )


def write_url_file(path: Path, url: str) -> None:
    """Written whole or not at all (a temp file beside it, then a rename): whoever waits for
    the file to appear reads the URL, never an empty or half-written file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(url + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"edgegrove dashboard: {exc}", file=sys.stderr)
        return 2
    from dashboard.server import bind_socket, make_server, url_of

    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"edgegrove dashboard: {exc}", file=sys.stderr)
        return 2
    url = url_of(settings.host, sock.getsockname()[1])

    def announce() -> None:
        """Once the server accepts requests (a replay is loaded by then): the URL works."""
        if settings.replay is not None:
            print(f"dashboard: {url}  (replay of {settings.replay})", flush=True)
        else:
            print(f"dashboard: {url}  (job {settings.job}, broker {settings.broker_url}, "
                  f"controls {'on' if settings.controls_enabled else 'off'})", flush=True)
        if args.url_file is not None:
            write_url_file(args.url_file, url)

    try:
        make_server(settings, on_started=announce).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        return 130
    return 0
