"""`edgegrove simulate`: a broker, the dashboard and a fleet on this machine, the faults of a
scenario, and a report. The fleet is one `edgegrove device` process per node, given the
scenario as one job through `edgegrove job submit`, and the trained model comes back into the
run directory through `edgegrove job fetch` (simulate.device_run); a run that a job cannot
carry (--sites, --backend mixed, --credentials), or --via-agents, runs one agent per node.

The scenario is validated before anything starts (a bad one exits with code 2). Readiness is
awaited by signals: the broker's port, every agent's retained `online` status. Faults fire when
the fleet enters their round (telemetry tells which round that is). Ctrl-C stops every process
the simulator started — by handle — and the report is still written. Progress goes to stderr;
with --json the summary is the one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.validate import UsageError, one_line
from simulate import model_choice, periodic_args, sites_sim
from simulate.model_choice import ModelChoice
from simulate.progress import say
from simulate.scenario import (
    RESERVED_AGENT_OPTIONS,
    BandwidthFault,
    IsolateFault,
    Scenario,
    ScenarioError,
    builtin_names,
    load_scenario,
)
from simulate.simulation import Simulation, fresh_job_name
from simulate.validate import check_args, check_credentials, choose_job

if TYPE_CHECKING:
    from simulate.device_run import DevicePlan

DESCRIPTION = __doc__
EXIT_OK, EXIT_HALTED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=None,
                        help=f"scenario: a .toml file or a built-in name ({', '.join(builtin_names())}); "
                             "default: 'default'")
    parser.add_argument("--nodes", type=int, default=None,
                        help="agents in the fleet (overrides the scenario's; scenario default 7)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds to train, 1 or more (overrides the scenario's); a simulation "
                             "always ends, to write its report: 0 is refused")
    parser.add_argument("--broker", default="auto",
                        help="auto (mosquitto from broker-config/ if installed, else embedded), "
                             "mosquitto, embedded, or mqtt://HOST:PORT of a running broker")
    parser.add_argument("--credentials", type=Path, default=None,
                        help="with --broker mqtt://...: credentials.json from broker-config/make-credentials")
    parser.add_argument("--job", default=None,
                        help="job name (topics edgegrove/JOB); default: the job of --credentials, "
                             "else a new sim-<timestamp> name")
    parser.add_argument("--tls", action="store_true",
                        help="the simulator's own mosquitto with TLS and dynamic security: a "
                             "throw-away CA (in the run directory) signs its certificate, and the "
                             "agents, the dashboard and the telemetry collector verify it with that "
                             "CA (mqtts://). Needs mosquitto (--broker auto or mosquitto); not with "
                             "faults that shape links in network namespaces")
    parser.add_argument("--no-persistence", action="store_true",
                        help="the simulator's own mosquitto without persistence (a broker restart "
                             "then forgets the retained statuses and view)")
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<timestamp>)")
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    parser.add_argument("--dashboard-port", type=int, default=8080,
                        help="dashboard port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--dashboard-host", default="127.0.0.1",
                        help="address the dashboard binds to (0.0.0.0 inside a container)")
    parser.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                        help="override one agent option for every agent, e.g. eval_samples=1000 "
                             "(repeatable; keys as in `edgegrove agent --help`, with underscores)")
    parser.add_argument("--baseline", choices=["auto", "none"], default="auto",
                        help="auto: compare with single-machine training (same samples/step, cached)")
    parser.add_argument("--ready-timeout", type=float, default=180.0,
                        help="seconds to wait for every agent's online status")
    parser.add_argument("--stall-timeout", type=float, default=90.0,
                        help="seconds without any telemetry after which the run counts as halted")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON document on stdout")
    _add_fleet_path_arguments(parser)
    model_choice.add_arguments(parser)
    periodic_args.add_arguments(parser)
    sites_sim.add_arguments(parser)


def _add_fleet_path_arguments(parser: argparse.ArgumentParser) -> None:
    via = parser.add_mutually_exclusive_group()
    via.add_argument("--via-devices", action="store_true",
                     help="the fleet as devices (`edgegrove device`, one process per node, each with "
                          "its own config and credentials) and the training as a job submitted with "
                          "`edgegrove job submit`; the trained model is fetched into the run directory "
                          "(model/). The default whenever the run allows it; with this flag, a run that "
                          "does not (--sites, --backend mixed, --credentials, an option a job cannot "
                          "set) is refused instead of run through agents")
    via.add_argument("--via-agents", action="store_true",
                     help="the fleet as one `edgegrove agent` process per node, each told the job's "
                          "settings on its command line (the way before devices and jobs)")


def parse_agent_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ScenarioError(f"--agent-option {item!r}: write KEY=VALUE, e.g. eval_samples=1000")
        if key in RESERVED_AGENT_OPTIONS:
            raise ScenarioError(f"--agent-option {key}: the simulator sets it itself")
        options[key] = _literal(value.strip())
    return options


def _literal(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_model_options(scenario: Scenario, model: ModelChoice) -> None:
    """Every agent's options as it will run (one numpy and one LiteRT agent of a mixed fleet)
    pass the agent's own configuration checks."""
    from simulate.scenario import _check_agent_options

    agent = {k: v for k, v in scenario.agent.items() if k not in model_choice.MODEL_OPTIONS}
    for node in sorted({0, min(1, scenario.fleet.nodes - 1)}):
        _check_agent_options({**agent, **model.agent_options(node)}, "--model/--dataset/--partition",
                             scenario.fleet.rounds)


def check_broker_choice(choice: str) -> str:
    if choice in ("auto", "mosquitto", "embedded") or choice.startswith(("mqtt://", "mqtts://")):
        return choice
    raise ScenarioError(f"--broker {choice!r}: use auto, mosquitto, embedded or mqtt://HOST:PORT")


def check_tls(tls: bool, choice: str, faults: Sequence[object]) -> None:
    """--tls sets up the simulator's own mosquitto: not the embedded broker nor one the user
    runs; and its certificate names 127.0.0.1 and localhost, not a network namespace's address."""
    if not tls:
        return
    from simulate import brokers

    if choice == "embedded" or choice.startswith(("mqtt://", "mqtts://")):
        raise ScenarioError(f"--tls is for the simulator's own mosquitto, not --broker {choice}")
    if any(isinstance(f, IsolateFault) or (isinstance(f, BandwidthFault) and f.via == "kernel") for f in faults):
        raise ScenarioError("--tls cannot run faults that put agents in network namespaces (isolate, "
                            "bandwidth via kernel): run that scenario without --tls")
    if not brokers.mosquitto_available():
        raise ScenarioError("--tls needs mosquitto, which is not installed")


def run(args: argparse.Namespace) -> int:
    try:
        check_args(args)
        scenario = load_scenario(args.scenario).with_fleet(args.nodes, args.rounds)
        extra = {**parse_agent_options(args.agent_option), **periodic_args.agent_options(args)}
        if extra:
            from simulate.scenario import _check_agent_options

            merged = {**scenario.agent, **extra}
            _check_agent_options(merged, "--agent-option", scenario.fleet.rounds)
            scenario = scenario.model_copy(update={"agent": merged})
        model = model_choice.choose(args, scenario.agent)
        check_model_options(scenario, model)
        model_choice.check_models(model, int(scenario.agent.get("seed", 0)))
        model_choice.check_dataset(model, scenario.agent, scenario.fleet.nodes)
        check_broker_choice(args.broker)
        check_tls(args.tls, args.broker, scenario.faults)
        check_credentials(args.credentials, scenario.fleet.nodes)
        job = choose_job(args.job, args.credentials, fresh_job_name())
        sites = sites_sim.check_sites(args, scenario)
        devices = _device_plan(args, scenario, model)
    except (ScenarioError, UsageError) as exc:
        print(f"edgegrove simulate: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    say(job.line())
    out = args.out or Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    sim = Simulation(scenario, out, args.broker, args.credentials, not args.no_dashboard,
                     args.dashboard_port, args.dashboard_host, args.baseline == "auto",
                     args.ready_timeout, args.stall_timeout, job=job.job,
                     persistence=not args.no_persistence, model=model, tls=args.tls, sites=sites,
                     devices=devices)

    def on_signal(signum: int, _frame: object) -> None:
        say(f"simulate: {signal.Signals(signum).name}: stopping every process started, writing the report")
        sim.stop_event.set()
        sim.watch.poke()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = sim.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    say(_human_summary(summary))
    if args.json:
        print(json.dumps(summary))
    if sim.stop_event.is_set():
        return EXIT_INTERRUPTED
    return EXIT_HALTED if summary.get("halted") or summary.get("error") else EXIT_OK


def _device_plan(args: argparse.Namespace, scenario: Scenario, model: ModelChoice) -> DevicePlan | None:
    """The fleet as devices and a job, unless --via-agents; what cannot go through devices is
    one ScenarioError line with --via-devices, and runs through agents (said) without it."""
    if getattr(args, "via_agents", False):
        return None
    try:
        return _checked_device_plan(args, scenario, model)
    except ScenarioError as exc:
        if getattr(args, "via_devices", False):
            raise
        say(f"simulate: the fleet runs as agents, not devices: {one_line(str(exc))}")
        return None


def _checked_device_plan(args: argparse.Namespace, scenario: Scenario, model: ModelChoice) -> DevicePlan:
    from simulate.device_run import DevicePlan

    if getattr(args, "sites", 0):
        raise ScenarioError("a fleet of devices runs on one broker: --sites runs as agents (drop --via-devices)")
    if args.credentials is not None:
        raise ScenarioError("devices get their credentials on the simulator's own broker: "
                            "--credentials runs as agents (drop --via-devices)")
    return DevicePlan.check(scenario, model)


def _refused_text(refused: list[int]) -> str:
    return f", refused (another model): nodes {', '.join(map(str, refused))}" if refused else ""


def _human_summary(s: dict[str, Any]) -> str:
    acc = s.get("final_test_accuracy")
    return (f"simulate: {s['rounds']} rounds, final test accuracy "
            f"{'n/a' if acc is None else f'{acc:.4f}'}, faults {s['faults_injected']} injected / "
            f"{s['faults_detected']} detected, degraded rounds {s['degraded_rounds']}, "
            f"median round {s['round_time_median_s'] or 0:.3f} s, wall {s['wall_time_s'] or 0:.1f} s"
            f"{_refused_text(s.get('refused_members') or [])}\n"
            f"simulate: report in {s['run_dir']}/report.md\n"
            f"simulate: open the run in the dashboard: edgegrove dashboard --replay {s['run_dir']}")
