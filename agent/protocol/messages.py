"""The JSON messages of a job (status, view, telemetry, control), as frozen dataclasses.

Binary allreduce frames live in wire.py. ``decode`` of untrusted bytes raises
``MessageError`` (and nothing else) with a short reason, so that receivers can count it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, TypeVar, get_args

from agent.protocol.allreduce import BROADCASTS
from agent.protocol.chunking import MAX_CHUNK_VALUES, MIN_CHUNK_VALUES

MAX_MESSAGE_BYTES = 256 * 1024

NodeState = Literal["online", "joining", "offline"]
LinkState = Literal["ok", "suspected", "failed", "rerouted"]
ControlAction = Literal[
    "cut", "heal", "crash", "restart", "hang", "resume", "loss", "latency", "isolate", "rejoin",
    "broker_restart",  # the simulator's own broker, down for ``value`` seconds (``node`` unused)
]


class MessageError(ValueError):
    """A JSON message that is not what its topic promises. ``reason`` is short and countable."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


T = TypeVar("T", bound="_JsonMessage")


@dataclass(frozen=True)
class _JsonMessage:
    """encode/decode shared by every JSON message; unknown fields are rejected."""

    KIND: ClassVar[str] = ""

    def encode(self) -> bytes:
        # The fields hold JSON values already: asdict() would deep-copy every nested dict and
        # list first (telemetry, every round). Same document.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls: type[T], data: bytes) -> T:
        if len(data) > MAX_MESSAGE_BYTES:
            raise MessageError("too_large", f"{len(data)} bytes")
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise MessageError("bad_json", str(exc)) from None
        if not isinstance(obj, dict):
            raise MessageError("bad_json", "not an object")
        names = {f.name for f in fields(cls)}
        unknown = set(obj) - names
        if unknown:
            raise MessageError("unknown_field", ",".join(sorted(unknown))[:100])
        try:
            msg = cls(**obj)
            msg.validate()
        except MessageError:
            raise
        except (TypeError, ValueError) as exc:
            raise MessageError("bad_field", str(exc)[:200]) from None
        return msg

    def validate(self) -> None:
        """Type and range checks; raise ValueError/TypeError."""


def _check_int(name: str, value: Any, lo: int = 0, hi: int = 2**53) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _check_number(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number{' or null' if optional else ''}, got {value!r}")


def _check_seconds(name: str, value: Any) -> None:
    _check_number(name, value)
    if not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


MAX_LOCAL_STEPS = 1_000_000  # local optimizer steps of one round at most (periodic averaging)
MAX_LABELS = 1024  # classes a label histogram may count
MAX_SITE_CHARS = 32  # a site name (agent/config.py: letters, digits, '.', '_' or '-')


def _check_site(name: str, site: Any) -> None:
    if not isinstance(site, str) or len(site) > MAX_SITE_CHARS or not all(
            c.isascii() and (c.isalnum() or c in "._-") for c in site):
        raise ValueError(f"{name} must be a site name of at most {MAX_SITE_CHARS} letters, digits, "
                         f"'.', '_' or '-', got {site!r}"[:200])
MAX_MODEL_NAME = 64


def _check_model(fingerprint: Any, model: Any, params: Any) -> None:
    """A model's identity as statuses and views announce it (membership.ModelIdentity)."""
    if not isinstance(fingerprint, str) or not (
            fingerprint == "" or (len(fingerprint) == 16 and all(c in "0123456789abcdef" for c in fingerprint))):
        raise ValueError(f"fingerprint must be 16 lowercase hex characters or empty, got {fingerprint!r}")
    if not isinstance(model, str) or len(model) > MAX_MODEL_NAME:
        raise ValueError(f"model must be a name of at most {MAX_MODEL_NAME} characters")
    _check_int("params", params)


MAX_EVIDENCE = 256  # signed suspicions a view may carry
SIGNATURE_CHARS = 88  # base64 of a 64-byte Ed25519 signature


def _check_sig(sig: Any) -> None:
    if not isinstance(sig, str) or len(sig) > SIGNATURE_CHARS:
        raise ValueError(f"sig must be a base64 signature of at most {SIGNATURE_CHARS} characters")


def _check_ids(name: str, ids: Any) -> None:
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"{name} must be a list of node ids")
    for i in ids:
        _check_int(name, i, 0, 1023)


@dataclass(frozen=True)
class Status(_JsonMessage):
    """Retained on ``status/<id>``; the Last Will publishes ``state="offline"``."""

    node: int
    state: NodeState
    round: int = 0
    pid: int = 0
    incarnation: int = 0
    # The model this agent trains (membership.ModelIdentity): its fingerprint (16 hex), name
    # and parameter count; "" / 0 from an agent that does not say (and in a Will).
    fingerprint: str = ""
    model: str = ""
    params: int = 0
    # Training samples per label in this agent's shard (index = label); [] when not said.
    labels: list[int] = field(default_factory=list)
    site: str = ""  # the agent's site (--site); "" when it has none
    # Periodic averaging with sync-every auto: this agent's running seconds per local step and
    # per sync (agent/protocol/sync_period.py), what the coordinator picks the period from;
    # 0 when not measured or not said.
    step_s: float = 0.0
    sync_s: float = 0.0
    sig: str = ""  # the node's device key's signature (``sealed_bytes``); "" unsigned

    def validate(self) -> None:
        _check_int("node", self.node, 0, 1023)
        _check_sig(self.sig)
        _check_site("site", self.site)
        for name in ("step_s", "sync_s"):
            _check_seconds(name, getattr(self, name))
        if self.state not in get_args(NodeState):
            raise ValueError(f"unknown state {self.state!r}")
        _check_int("round", self.round)
        _check_int("pid", self.pid)
        _check_int("incarnation", self.incarnation)
        _check_model(self.fingerprint, self.model, self.params)
        if not isinstance(self.labels, list) or len(self.labels) > MAX_LABELS:
            raise ValueError(f"labels must be a list of at most {MAX_LABELS} counts")
        for count in self.labels:
            _check_int("labels[]", count)


@dataclass(frozen=True)
class Suspect(_JsonMessage):
    """On ``suspect/<node>``: ``node`` heard nothing at all from ``peer`` for a whole timeout
    in round ``round`` (a link declared dead, or a silent child). Evidence for the fleet-level
    failure detector (membership.py); one witness alone never evicts anybody.

    With ``peer == node`` it is a *self-report*: ``node`` takes no part in the rounds up to
    ``round`` although their view lists it (it fell behind and fetches the fleet's state, or
    it left to rejoin), so nobody waits a timeout for it there. It can only excuse its sender."""

    node: int
    round: int
    peer: int
    incarnation: int = 0
    sig: str = ""  # the reporter's device key's signature (``sealed_bytes``); "" unsigned

    @property
    def is_self_report(self) -> bool:
        return self.peer == self.node

    def validate(self) -> None:
        _check_int("node", self.node, 0, 1023)
        _check_sig(self.sig)
        _check_int("round", self.round)
        _check_int("peer", self.peer, 0, 1023)
        _check_int("incarnation", self.incarnation)


@dataclass(frozen=True)
class View(_JsonMessage):
    """Retained on ``view``, published by the coordinator (lowest live id).

    Every member adopts it at the start of round ``from_round`` so that all agree on the
    tree of a round without a consensus protocol.
    """

    epoch: int
    members: list[int]
    arity: int
    coordinator: int
    from_round: int
    # Values per chunk in its rounds, the coordinator's pick for the links it sees
    # (agent/protocol/chunking.py); 0: the agents' configured chunk_size.
    chunk_values: int = 0
    # How the result reaches the members in its rounds (ft-tree), the coordinator's pick for
    # the links it sees: "fanout" or "tree"; "": the agents' configured broadcast.
    broadcast: str = ""
    # The fleet's model, the coordinator's own (membership.ModelIdentity): only agents with
    # this fingerprint are admitted; "" / 0 from a coordinator that does not say.
    fingerprint: str = ""
    model: str = ""
    params: int = 0
    # Each member's site, in the order of ``members`` (their statuses'); [] when no member has
    # one: the tree then ignores sites (agent/protocol/topology.py).
    sites: list[str] = field(default_factory=list)
    # Periodic averaging: local steps per round in its rounds, the coordinator's pick from the
    # members' timings (sync-every auto, agent/protocol/sync_period.py); 0: as configured.
    sync_every: int = 0
    # The certificate of the members it drops for silence: signed suspicions about each, from
    # more than half of its members (membership/evidence.py); Suspect documents.
    evidence: list[dict[str, Any]] = field(default_factory=list)
    sig: str = ""  # the coordinator's device key's signature (``sealed_bytes``); "" unsigned

    def validate(self) -> None:
        _check_int("epoch", self.epoch)
        _check_sig(self.sig)
        if not isinstance(self.evidence, list) or len(self.evidence) > MAX_EVIDENCE:
            raise ValueError(f"evidence must be a list of at most {MAX_EVIDENCE} signed suspicions")
        for entry in self.evidence:
            if not isinstance(entry, dict) or set(entry) - SUSPECT_FIELDS:
                raise ValueError("evidence[] must be suspicion documents")
        _check_int("sync_every", self.sync_every, 0, MAX_LOCAL_STEPS)
        if not isinstance(self.sites, list) or (self.sites and len(self.sites) != len(self.members)):
            raise ValueError("sites must be empty or name one site per member")
        for site in self.sites:
            _check_site("sites[]", site)
        _check_model(self.fingerprint, self.model, self.params)
        if not self.fingerprint:  # a view without one would pass every agent's model check
            raise ValueError("a view must name the fleet's model fingerprint")
        if self.broadcast not in ("", *BROADCASTS):
            raise ValueError(f"broadcast must be one of {BROADCASTS} or empty, got {self.broadcast!r}")
        if not (type(self.chunk_values) is int and self.chunk_values == 0):
            _check_int("chunk_values", self.chunk_values, MIN_CHUNK_VALUES, MAX_CHUNK_VALUES)
        _check_ids("members", self.members)
        if list(self.members) != sorted(set(self.members)):
            raise ValueError("members must be sorted and unique")
        _check_int("arity", self.arity, 2, 16)
        _check_int("coordinator", self.coordinator, 0, 1023)
        _check_int("from_round", self.from_round)


SUSPECT_FIELDS = frozenset(f.name for f in fields(Suspect))
Signed = Status | Suspect | View  # the control messages members sign


def sealed_bytes(message: Signed) -> bytes:
    """What a control message's signature covers: its encoding without the signature."""
    return replace(message, sig="").encode()


def suspect_of(entry: dict[str, Any]) -> Suspect | None:
    """A view's evidence entry as the suspicion it is; None when it is not one."""
    try:
        report = Suspect(**entry)
        report.validate()
    except (TypeError, ValueError):
        return None
    return report


@dataclass(frozen=True)
class StateDigest(_JsonMessage):
    """Retained on ``state/<id>``: the full digest (state_transfer.state_digest, 32 hex) of
    ``node``'s training state at the start of round ``round``. The coordinator announces it
    every round, a member whenever it serves its state."""

    node: int
    round: int
    digest: str

    def validate(self) -> None:
        _check_int("node", self.node, 0, 1023)
        _check_int("round", self.round)
        if not isinstance(self.digest, str) or len(self.digest) != 32 or any(
                c not in "0123456789abcdef" for c in self.digest):
            raise ValueError("digest must be 32 lowercase hex characters")


@dataclass(frozen=True)
class Telemetry(_JsonMessage):
    """One agent's report of one round, on ``telemetry/<id>``.

    ``links`` maps a peer id (as a string, JSON keys) to the link state this node saw;
    ``events`` are short records like {"kind": "reroute", "peer": 3, "detail": "via 4"}.
    """

    node: int
    round: int
    epoch: int
    algorithm: str
    wall_time: float
    loss: float | None = None
    accuracy: float | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0
    contributors: int = 0
    members: int = 0
    reroutes: int = 0
    timeouts: int = 0
    nacks: int = 0
    pulls: int = 0
    retransmits: int = 0  # units resent on the same link: what a lossy link costs
    degraded: bool = False
    missing_chunks: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    model_hash: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    # The agent's CPU architecture (platform.machine(): "x86_64", "aarch64", ...); optional, ""
    # from an agent that does not say.
    machine: str = ""
    # Frames of values this agent sent in the round by wire format ("float32", "float16",
    # "int8"): which ones wire_dtype "auto" chose. Optional, {} from an agent that does not say.
    wire_frames: dict[str, int] = field(default_factory=dict)
    # Wall-clock time (seconds since the epoch) at which the round's allreduce ended, so that a
    # bench can line up the agents of one host; optional, 0 from an agent that does not say.
    reduced_at: float = 0.0
    # Optimizer steps whose result the round averaged (periodic averaging: sync-every; 1: a
    # gradient per step) and the training samples behind this agent's contribution (0: not said).
    local_steps: int = 1
    samples: int = 0
    # What the agent's process costs its device (the runtime reads it from the OS): CPU in
    # percent of one core since its previous report (None: not said) and its resident memory
    # in bytes (0: not said).
    cpu_percent: float | None = None
    rss_bytes: int = 0
    # Differential privacy (agent/privacy): the epsilon this agent's data has spent so far, at
    # the job's delta (None: no DP, or no accountant on the device).
    dp_epsilon: float | None = None

    def validate(self) -> None:
        _check_int("node", self.node, 0, 1023)
        _check_int("round", self.round)
        _check_int("epoch", self.epoch)
        _check_int("local_steps", self.local_steps, 1, MAX_LOCAL_STEPS)
        for name in ("bytes_sent", "bytes_received", "contributors", "members", "reroutes",
                     "timeouts", "nacks", "pulls", "retransmits", "missing_chunks", "samples",
                     "rss_bytes"):
            _check_int(name, getattr(self, name))
        if not isinstance(self.degraded, bool):
            raise ValueError("degraded must be a boolean")
        if not isinstance(self.algorithm, str) or not isinstance(self.model_hash, str):
            raise ValueError("algorithm and model_hash must be strings")
        if not isinstance(self.machine, str) or len(self.machine) > 64:
            raise ValueError("machine must be a string of at most 64 characters")
        _check_number("wall_time", self.wall_time)
        _check_number("reduced_at", self.reduced_at)
        _check_number("loss", self.loss, optional=True)
        _check_number("accuracy", self.accuracy, optional=True)
        _check_number("cpu_percent", self.cpu_percent, optional=True)
        if self.cpu_percent is not None and self.cpu_percent < 0:
            raise ValueError("cpu_percent must not be negative")
        if not isinstance(self.links, dict) or not all(
            isinstance(v, str) and v in get_args(LinkState) for v in self.links.values()
        ):
            raise ValueError("links must map peer ids to ok/suspected/failed/rerouted")
        if not isinstance(self.wire_frames, dict) or len(self.wire_frames) > 8:
            raise ValueError("wire_frames must map at most 8 wire formats to counts")
        for name, count in self.wire_frames.items():
            _check_int(f"wire_frames[{name}]", count)
        if not isinstance(self.rejected, dict):
            raise ValueError("rejected must map reasons to counts")
        for reason, count in self.rejected.items():
            _check_int(f"rejected[{reason}]", count)
        if not isinstance(self.phase_seconds, dict):
            raise ValueError("phase_seconds must be an object")
        for phase, seconds in self.phase_seconds.items():
            _check_number(f"phase_seconds[{phase}]", seconds)
        if not isinstance(self.events, list) or not all(isinstance(e, dict) for e in self.events):
            raise ValueError("events must be a list of objects")


@dataclass(frozen=True)
class Control(_JsonMessage):
    """A fault-injection command on ``control`` (simulator and the dashboard's admin only).

    ``node``/``peer`` name the target (a link is node->peer, both directions unless
    ``one_way``); ``value`` is the loss probability or the added latency in seconds.
    """

    action: ControlAction
    node: int
    peer: int | None = None
    value: float | None = None
    one_way: bool = False

    def validate(self) -> None:
        if self.action not in get_args(ControlAction):
            raise ValueError(f"unknown action {self.action!r}")
        _check_int("node", self.node, 0, 1023)
        if self.peer is not None:
            _check_int("peer", self.peer, 0, 1023)
        _check_number("value", self.value, optional=True)
        if not isinstance(self.one_way, bool):
            raise ValueError("one_way must be a boolean")
        if self.action in ("cut", "heal") and self.peer is None:
            raise ValueError(f"{self.action} needs a peer")
        if self.action in ("loss", "latency") and not isinstance(self.value, (int, float)):
            raise ValueError(f"{self.action} needs a numeric value")
