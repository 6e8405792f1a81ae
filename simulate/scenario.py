"""Scenario files: a fleet, the agents' options and the faults to inject, in TOML.

A scenario is validated completely (pydantic, unknown keys rejected) before anything starts;
``load_scenario`` raises ``ScenarioError`` whose message names the file, the offending entry
and what to write instead. Rounds are the agents' round numbers (the ones in telemetry and on
the dashboard). A fault is in effect from the start of ``at_round`` until the start of its
``heal_round`` (``restart_round`` for a crash, ``resume_round`` for a hang); without one it
lasts to the end of the run.

Example::

    name = "thesis-1-fault"
    description = "one tree link cut between iterations 5 and 10"

    [fleet]
    nodes = 7
    rounds = 15

    [agent]                      # any `edgegrove agent` option (its config-file keys)
    timeout_mode = "fixed"
    timeout = 0.5

    [[faults]]
    kind = "link"                # link | loss | latency | bandwidth | flap | crash | hang | isolate
                                 # | broker-restart
    nodes = [1, 3]               # the link's two ends
    at_round = 5
    heal_round = 10

A ``broker-restart`` (``outage = 5.0`` seconds) names no node and no end round: it is over
when the broker is back. Only the simulator's own mosquitto can be restarted.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

DEFAULT_SCENARIO = "default"

Phase = Literal["start", "mid"]


class ScenarioError(ValueError):
    """A scenario that cannot run; the message says where and what to change."""


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # The field that ends the fault (a crash ends at restart_round, a hang at resume_round).
    END_FIELD: ClassVar[str] = "heal_round"

    at_round: int = Field(ge=0, description="round at whose start the fault begins")
    phase: Phase = Field(
        "start",
        description="'start': when the fleet enters at_round; 'mid': half a round later "
        "(during that round's allreduce)",
    )

    @model_validator(mode="after")
    def _check_end(self) -> _Fault:
        end = self.end_round
        if end is not None and end <= self.at_round:
            raise ValueError(f"{self.END_FIELD} ({end}) must come after at_round ({self.at_round})")
        return self

    @property
    def end_round(self) -> int | None:
        """Round at whose start the fault is undone; None = lasts to the end of the run."""
        end: int | None = getattr(self, self.END_FIELD)
        return end

    @property
    def targets(self) -> tuple[int, ...]:
        """Node ids the fault names (checked against the fleet size)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class _NodeFault(_Fault):
    node: int

    @property
    def targets(self) -> tuple[int, ...]:
        return (self.node,)


class LinkFault(_Fault):
    """Cut the link between two nodes: at the broker (dynamic security) or agent-side drop."""

    kind: Literal["link"]
    nodes: tuple[int, int]
    heal_round: int | None = None
    via: Literal["auto", "broker", "agent"] = Field(
        "auto", description="broker = dynsec revoke (mosquitto only); agent = agents drop frames"
    )
    one_way: bool = Field(False, description="cut only nodes[0] -> nodes[1]")

    @model_validator(mode="after")
    def _check_nodes(self) -> LinkFault:
        if self.nodes[0] == self.nodes[1]:
            raise ValueError(f"a link needs two different nodes, got {list(self.nodes)}")
        return self

    @property
    def targets(self) -> tuple[int, ...]:
        return self.nodes

    def describe(self) -> str:
        arrow = "->" if self.one_way else "<->"
        return f"link {self.nodes[0]}{arrow}{self.nodes[1]} cut"


class LossFault(_NodeFault):
    """Each link frame the node sends or receives is dropped with probability p."""

    kind: Literal["loss"]
    p: float = Field(gt=0.0, le=1.0)
    heal_round: int | None = None

    def describe(self) -> str:
        return f"node {self.node} loses frames with p={self.p:g}"


class LatencyFault(_NodeFault):
    """Extra one-way delay on the node's traffic: through its TCP proxy or agent-side."""

    kind: Literal["latency"]
    seconds: float = Field(gt=0.0, le=30.0)
    heal_round: int | None = None
    via: Literal["auto", "proxy", "agent"] = Field(
        "auto", description="proxy = user-space TCP proxy (auto); agent = agent holds frames"
    )

    def describe(self) -> str:
        return f"node {self.node} +{self.seconds * 1000:g} ms latency"


class BandwidthFault(_NodeFault):
    """Limit the node's traffic (each direction): through its TCP proxy, or in the kernel."""

    kind: Literal["bandwidth"]
    bytes_per_second: float = Field(ge=1000.0)
    heal_round: int | None = None
    via: Literal["proxy", "kernel"] = Field(
        "proxy", description="proxy = the agent's user-space TCP proxy paces its bytes; kernel = "
        "the agent runs in a network namespace whose veth link a tbf qdisc limits (root, iproute2: "
        "no process of ours in the path, as on a real link)"
    )

    def describe(self) -> str:
        where = " in the kernel" if self.via == "kernel" else ""
        return f"node {self.node} limited to {self.bytes_per_second / 1e6:g} MB/s{where}"


class FlapFault(_NodeFault):
    """The node's broker connection drops ``times`` times, every ``every`` seconds (its TCP
    proxy cuts it; the agent reconnects each time): a flaky Wi-Fi link, or a client-id
    takeover fight. The broker publishes its Will at each drop."""

    kind: Literal["flap"]
    times: int = Field(10, ge=1, le=1000)
    every: float = Field(1.5, gt=0.0, le=60.0)
    heal_round: int | None = None

    def describe(self) -> str:
        return f"node {self.node}'s connection drops {self.times} times, every {self.every:g} s"


class CrashFault(_NodeFault):
    """SIGKILL the node's process; respawn it (same checkpoint dir) at restart_round."""

    END_FIELD: ClassVar[str] = "restart_round"
    kind: Literal["crash"]
    restart_round: int | None = None

    def describe(self) -> str:
        return f"node {self.node} crashed (SIGKILL)"


class HangFault(_NodeFault):
    """SIGSTOP the node's process (socket open, silent); SIGCONT at resume_round."""

    END_FIELD: ClassVar[str] = "resume_round"
    kind: Literal["hang"]
    resume_round: int | None = None

    def describe(self) -> str:
        return f"node {self.node} hung (SIGSTOP)"


class IsolateFault(_NodeFault):
    """Drop all of the node's packets with iptables in its network namespace (root only),
    until ``heal_round``, or for ``seconds`` (a cut of a known length, whatever the rounds)."""

    kind: Literal["isolate"]
    heal_round: int | None = None
    seconds: float | None = Field(None, gt=0.0, le=3600.0, description="heal after this many seconds")

    @model_validator(mode="after")
    def _one_end(self) -> IsolateFault:
        if self.seconds is not None and self.heal_round is not None:
            raise ValueError("give heal_round or seconds, not both")
        return self

    def describe(self) -> str:
        return f"node {self.node} isolated (netns + iptables)"


class BrokerRestartFault(_Fault):
    """Stop the simulator's own mosquitto and start it again on the same port ``outage``
    seconds later (same config, same credentials; its persistence file, if on, is kept)."""

    kind: Literal["broker-restart"]
    outage: float = Field(5.0, gt=0.0, le=600.0, description="seconds the broker stays down")

    @property
    def end_round(self) -> int | None:
        return None  # it ends when the broker is back, whatever round that is

    @property
    def targets(self) -> tuple[int, ...]:
        return ()

    def describe(self) -> str:
        return f"broker restarted ({self.outage:g} s outage)"


class _SiteFault(_Fault):
    site: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,32}$", description="the site, as --sites names them: s0, s1, ...")

    @property
    def targets(self) -> tuple[int, ...]:
        return ()


class BridgeCutFault(_SiteFault):
    """Cut the site's uplink to the core broker (``simulate --sites``): its bridge drops and
    cannot redial, the site's own broker and agents run on; until ``heal_round`` or for
    ``seconds``."""

    kind: Literal["bridge-cut"]
    heal_round: int | None = None
    seconds: float | None = Field(None, gt=0.0, le=3600.0, description="heal after this many seconds")

    @model_validator(mode="after")
    def _one_end(self) -> BridgeCutFault:
        if self.seconds is not None and self.heal_round is not None:
            raise ValueError("give heal_round or seconds, not both")
        return self

    def describe(self) -> str:
        return f"site {self.site} cut off the core (bridge down)"


class SiteBrokerRestartFault(_SiteFault):
    """Stop the site's broker and start it again ``outage`` seconds later (``simulate --sites``)."""

    kind: Literal["site-broker-restart"]
    outage: float = Field(5.0, gt=0.0, le=600.0, description="seconds the site's broker stays down")

    @property
    def end_round(self) -> int | None:
        return None

    def describe(self) -> str:
        return f"site {self.site}'s broker restarted ({self.outage:g} s outage)"


Fault = Annotated[
    LinkFault | LossFault | LatencyFault | BandwidthFault | FlapFault | CrashFault | HangFault
    | IsolateFault | BrokerRestartFault | BridgeCutFault | SiteBrokerRestartFault,
    Field(discriminator="kind"),
]
FAULT_KINDS = ("link", "loss", "latency", "bandwidth", "flap", "crash", "hang", "isolate",
               "broker-restart", "bridge-cut", "site-broker-restart")
_FAULT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Fault)


class FleetSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(7, ge=1, le=256, description="agents in the fleet")
    rounds: int = Field(30, ge=1, description="rounds to train")


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    fleet: FleetSection = Field(default_factory=lambda: FleetSection(nodes=7, rounds=30))
    agent: dict[str, Any] = Field(
        default_factory=dict, description="options for every agent (`edgegrove agent` config keys)"
    )
    faults: list[Fault] = Field(default_factory=list)

    def with_fleet(self, nodes: int | None, rounds: int | None) -> Scenario:
        """The scenario with the command line's --nodes/--rounds, re-checked."""
        fleet = self.fleet.model_copy(
            update={k: v for k, v in (("nodes", nodes), ("rounds", rounds)) if v is not None}
        )
        scenario = self.model_copy(update={"fleet": fleet})
        scenario.check_fleet()
        return scenario

    def check_fleet(self) -> None:
        """Every node id exists and every fault happens within the run."""
        n, rounds = self.fleet.nodes, self.fleet.rounds
        for index, fault in enumerate(self.faults):
            where = f"faults[{index}] ({fault.kind})"
            bad = [t for t in fault.targets if not 0 <= t < n]
            if bad:
                raise ScenarioError(
                    f"{where}: node id {bad[0]} is out of range: this fleet has {n} nodes "
                    f"(ids 0..{n - 1}); use a smaller id or --nodes {max(bad) + 1}"
                )
            if fault.at_round >= rounds:
                raise ScenarioError(
                    f"{where}: at_round {fault.at_round} is past the end of the run "
                    f"({rounds} rounds, 0..{rounds - 1}); use --rounds {fault.at_round + 1} or more"
                )


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "scenario"
        msg = err["msg"]
        if err["type"] == "union_tag_invalid":
            msg = f"unknown fault kind {err.get('input', {}).get('kind')!r}; use one of: " + ", ".join(FAULT_KINDS)
        elif err["type"] == "union_tag_not_found":
            msg = "a fault needs `kind = ...`, one of: " + ", ".join(FAULT_KINDS)
        elif err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see the scenario format in docs/SCENARIOS.md)"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Parse and validate TOML text. Raises ScenarioError with a readable message."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"scenario {source} is not valid TOML: {exc}") from None
    data.setdefault("name", Path(source).stem)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"scenario {source} is not valid:\n{_format_errors(exc)}") from None
    _check_agent_options(scenario.agent, source, scenario.fleet.rounds)
    try:
        scenario.check_fleet()
    except ScenarioError as exc:
        raise ScenarioError(f"scenario {source}: {exc}") from None
    return scenario


# Options the simulator sets itself for every agent: a scenario may not override them.
RESERVED_AGENT_OPTIONS = frozenset(
    {"id", "job", "broker", "username", "password", "credentials", "fleet_size", "rounds",
     "checkpoint_dir", "tls_ca"}
)


def _check_agent_options(options: dict[str, Any], source: str, rounds: int) -> None:
    from agent.config import AgentConfig

    reserved = sorted(set(options) & RESERVED_AGENT_OPTIONS)
    if reserved:
        raise ScenarioError(
            f"scenario {source}: [agent] may not set {', '.join(reserved)}: the simulator sets "
            "them (use [fleet] nodes/rounds or the command's flags)"
        )
    try:
        AgentConfig(id=0, rounds=rounds, **options)  # the simulator gives every agent rounds
    except ValidationError as exc:
        raise ScenarioError(f"scenario {source}: [agent] is not valid:\n{_format_errors(exc)}") from None


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in _builtin_dir().iterdir() if p.name.endswith(".toml"))


def _builtin_dir() -> Any:
    return resources.files("simulate") / "scenarios"


def load_scenario(name_or_path: str | Path | None) -> Scenario:
    """A scenario from a file path, or a built-in one by name (default: 'default')."""
    name = str(name_or_path) if name_or_path is not None else DEFAULT_SCENARIO
    path = Path(name)
    if path.suffix == ".toml" or path.exists():
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ScenarioError(
                f"scenario file {path} does not exist; built-in scenarios: {', '.join(builtin_names())}"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ScenarioError(f"scenario file {path} cannot be read: {exc}") from None
        return parse_scenario(text, str(path))
    if name not in builtin_names():
        raise ScenarioError(
            f"no scenario named {name!r}: give a .toml file or one of: {', '.join(builtin_names())}"
        )
    text = (_builtin_dir() / f"{name}.toml").read_text()
    return parse_scenario(text, f"{name}.toml")
