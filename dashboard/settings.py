"""What one dashboard server needs to know, parsed once by the CLI (or built by the simulator)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from agent.protocol.topics import Topics, validate_job


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool = False


def parse_broker_url(url: str) -> BrokerAddress:
    """``mqtt://host:port`` (or ``mqtts://``, or a bare ``host:port``) -> address.

    Raises ValueError with a message that says what a valid URL looks like.
    """
    text = url if "://" in url else f"mqtt://{url}"
    parts = urlsplit(text)
    if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parts.hostname:
        raise ValueError(f"broker URL {url!r} is not valid: use mqtt://HOST:PORT")
    tls = parts.scheme in ("mqtts", "ssl")
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError:
        raise ValueError(f"broker URL {url!r} has a bad port: use mqtt://HOST:PORT") from None
    return BrokerAddress(parts.hostname, port, tls)


@dataclass(frozen=True)
class DashboardSettings:
    """Everything ``create_app`` needs. ``broker_url=None`` serves an empty fleet (tests)."""

    broker_url: str | None = None
    job: str = "default"
    ca_file: Path | None = None  # the CA that signed an mqtts:// broker's certificate (None: the system's)
    username: str | None = None
    password: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    control_token: str | None = None
    event_log: Path | None = None
    topic_prefix: str = ""
    # The last rounds and events the page is pushed live; the server keeps every round of the
    # run (served paged by /api/rounds) and loads earlier ones on request.
    max_rounds: int = 2000
    max_events: int = 2000
    # The whole history of events (served paged by /api/events) is kept up to this many; the
    # counters say how many earlier ones went (events_dropped).
    max_history: int = 1_000_000
    # Rounds of each node's own series (round time, CPU, memory, bytes) kept for the charts.
    max_node_points: int = 4096
    # A node that stays silent this long while the fleet moves on is suspected, then hung.
    suspect_after: float = 5.0
    hung_after: float = 15.0
    # The WebSocket sends at most one snapshot per this many seconds.
    push_interval: float = 0.2
    client_id: str = ""
    # WebSocket: browsers send Origin; only the dashboard's own host (the request's Host) and
    # these origins (e.g. "https://fleet.example.org") may open /ws, so a foreign page in the
    # operator's browser cannot read the fleet. Sockets beyond the cap are refused.
    allowed_origins: tuple[str, ...] = ()
    # Host names (besides the bind address, localhost and IP addresses) the dashboard answers
    # to; "*" answers any. Other names are refused: a DNS-rebinding page cannot read the fleet.
    allowed_hosts: tuple[str, ...] = ()
    max_websockets: int = 32
    # Serve a finished simulator run (its directory) instead of following a broker.
    replay: Path | None = None
    # The live run's directory, whose agents/agent-N.log the page can tail (a replay's own).
    run_dir: Path | None = None
    fleet_size: int | None = None  # the simulator's fleet size: control node ids are checked
    total_rounds: int | None = None  # the simulator's rounds: an agent done with them exits
    # Named operator accounts (dashboard.accounts): reading needs a login, acting the
    # operator role. None: the page is open to read, the control token acts.
    accounts_file: Path | None = None

    def __post_init__(self) -> None:
        validate_job(self.job)
        if self.broker_url is not None:
            parse_broker_url(self.broker_url)
        if self.ca_file is not None and (self.broker_url is None or not parse_broker_url(self.broker_url).tls):
            raise ValueError("--ca-file is for a broker at mqtts://HOST:PORT")
        if self.control_token is not None and len(self.control_token) < 8:
            raise ValueError("the control token must have at least 8 characters")
        if self.max_websockets < 1:
            raise ValueError("--max-websockets must be at least 1")
        if self.max_node_points < 8:
            raise ValueError("--max-node-points must be at least 8")
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"allowed origin {origin!r} is not valid: use http(s)://HOST[:PORT]")

    @property
    def topics(self) -> Topics:
        return Topics(self.job, self.topic_prefix)

    @property
    def logs_run_dir(self) -> Path | None:
        """The run directory agent logs are read from: the replayed run's, else run_dir."""
        return self.replay if self.replay is not None else self.run_dir

    @property
    def controls_enabled(self) -> bool:
        return bool(self.control_token) or self.accounts_file is not None
