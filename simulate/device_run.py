"""`edgegrove simulate --via-devices`: the run's fleet as devices and one job.

The simulator writes an operator key and one device config per node (simulate.device_setup),
starts one device process per node (``simulate.faulty_device``: `edgegrove device` with the
fault injector on its job transport), waits for every device's record, and submits the job
through `edgegrove job submit`'s own code with the scenario's settings. The job's training
traffic is today's (``edgegrove/<job>/...``), so the collector, the dashboard and the fault
injector follow it unchanged; a device process is a node, so killing, stopping and restarting
it are a node's crash, hang and reboot. When every device's execution has ended the simulator
fetches the trained model into ``<run>/model`` with `job fetch`'s code.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from agent.jobs import signing
from agent.jobs.document import AGENT_OPTIONS
from agent.jobs.states import ExecState
from agent.validate import one_line
from simulate.device_setup import (
    DataSource,
    DeviceConfig,
    JobOptions,
    check_model_for_job,
    data_source,
    device_names,
    job_document,
    split_options,
    toml_document,
    write_device_config,
)
from simulate.device_watch import DeviceWatch
from simulate.fleet import AgentSpec, Fleet
from simulate.model_choice import ModelChoice
from simulate.progress import say
from simulate.scenario import Scenario
from simulate.stage import BrokerSetup
from simulate.telemetry import EventLog, FleetWatch

if TYPE_CHECKING:
    from simulate.brokers import Credentials, MosquittoBroker

MODEL_DIR = "model"


@dataclass(frozen=True)
class Login:
    """How the simulator and a device reach the broker."""

    url: str
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None


@dataclass(frozen=True)
class DevicePlan:
    """The devices and the job of a run, checked before anything starts."""

    names: tuple[str, ...]
    options: JobOptions
    source: DataSource

    @classmethod
    def check(cls, scenario: Scenario, model: ModelChoice) -> DevicePlan:
        """ScenarioError (one line, exit 2) for what a job cannot carry."""
        check_model_for_job(model)
        options = split_options(scenario.agent, AGENT_OPTIONS)
        source = data_source(model.dataset, options.label_column)
        return cls(tuple(device_names(scenario.fleet.nodes)), options, source)


class DeviceRun:
    """The devices and the job of one simulation."""

    def __init__(self, plan: DevicePlan, run_dir: Path, job: str, scenario: Scenario,
                 model: ModelChoice, log: EventLog, watch: FleetWatch) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.job = job
        self.scenario = scenario
        self.model = model
        self.log = log
        self.watch = watch
        self.devices: DeviceWatch | None = None
        self.login: Login | None = None  # the operator's: submits the job, fetches its model
        self.key_path = run_dir / "operator.key"
        self.job_path = run_dir / "job.toml"
        self.fetched: dict[str, Any] | None = None
        self._submit: subprocess.Popen[str] | None = None
        self._submit_out: IO[str] | None = None

    # -- before the fleet starts -------------------------------------------------------------

    def write_files(self, base: list[AgentSpec], credentials_of: Callable[[str], tuple[str, str] | None],
                    ca_file: str | None, labels: Mapping[str, str]) -> list[AgentSpec]:
        """The operator key, the job file and every device's config; the specs that start the
        devices, each with the broker address and command prefix of ``base``'s agent (its
        proxy, its network namespace)."""
        key = signing.generate_key()
        self.key_path.write_text(signing.private_key_text(key) + "\n")
        self.key_path.chmod(0o600)
        public = signing.public_key_text(key)
        document = job_document(self.job, self.model, self.plan.options, self.scenario.fleet.rounds,
                                len(self.plan.names), self.plan.source)
        self.job_path.write_text(toml_document(document))
        specs = []
        for spec, name in zip(base, self.plan.names, strict=True):
            home = self.run_dir / "devices" / name
            user, password = credentials_of(name) or (None, None)
            config = DeviceConfig(name, spec.broker_url, home / "state", public, (self.plan.source,),
                                  dict(labels), user, password, ca_file)
            path = write_device_config(home / "device.toml", config)
            specs.append(replace(spec, options={}, checkpoint_dir=home / "state", device_config=path))
        return specs

    def prepare(self, stack: ExitStack, broker: BrokerSetup, mosquitto: MosquittoBroker | None,
                base: list[AgentSpec]) -> list[AgentSpec]:
        """Device configs for the nodes (each with the broker address of ``base``'s agent: its
        proxy, its namespace); the simulator's ear on their records and executions."""
        user, password = broker.admin or (None, None)
        logins = {}
        if mosquitto is not None:  # each device its own user; link cuts in the job's roles
            from agent.operator.grants import role_name

            user, password = mosquitto.operator_credentials.username, mosquitto.operator_credentials.password
            logins = {name: mosquitto.device_credentials(name) for name in self.plan.names}
            mosquitto.node_role = lambda node: role_name(self.job, node)
        self.login = Login(broker.url, user, password, broker.ca_file)
        self.listen(stack, self.login)
        return self.write_files(base, lambda name: _device_login(logins, name), broker.ca_file,
                                {"simulate": self.job})

    def listen(self, stack: ExitStack, login: Login) -> None:
        self.devices = DeviceWatch(login.url, self.job, self.log, self.watch, login.username,
                                   login.password, login.ca_file)
        self.devices.start()
        stack.callback(self.devices.stop)

    # -- the job -----------------------------------------------------------------------------

    def await_devices(self, timeout: float, stopped: Callable[[], bool],
                      check_exits: Callable[[], None]) -> None:
        """Until every device's record says it is up and idle (RuntimeError after ``timeout``)."""
        assert self.devices is not None
        devices, names = self.devices, self.plan.names
        deadline = time.monotonic() + timeout
        while not stopped():
            if devices.wait_for(lambda: len(devices.up(names)) == len(names) or stopped(), 1.0):
                break
            check_exits()
            if time.monotonic() > deadline:
                up = devices.up(names)
                raise RuntimeError(f"only {len(up)} of {len(names)} devices published their record "
                                   f"within {timeout:.0f} s; see {self.run_dir / 'agents'}")
        self.log.add("run", phase="devices_ready", devices=list(devices.up(names)))

    def submit_when_up(self, timeout: float, stopped: Callable[[], bool], check_exits: Callable[[], None]) -> None:
        """Once every device is up: the job, through `job submit`'s path."""
        assert self.login is not None
        say(f"simulate: waiting for {len(self.plan.names)} devices to publish their records")
        self.await_devices(timeout, stopped, check_exits)
        if stopped():
            return
        grants = "auto" if self.login.username is not None else "none"  # embedded: no ACLs
        self.start_submit(self.login, grants)
        say(f"simulate: submitting job {self.job} ({self.job_path})")

    def start_submit(self, login: Login, grants: str = "auto") -> None:
        """`edgegrove job submit job.toml`, the command itself, in a process of its own: the
        simulator follows the fleet (and fires the faults of its first rounds) meanwhile.
        ``grants`` none: a broker without dynamic security (the embedded one)."""
        argv = [sys.executable, "-m", "edgegrove.cli", "job", "submit", str(self.job_path),
                "--key", str(self.key_path), "--grants", grants, "--broker", login.url, "--json"]
        if login.ca_file is not None:
            argv += ["--tls-ca", login.ca_file]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if login.username is not None:  # not on the command line: ps would show it
            env.update(EDGEGROVE_USERNAME=login.username, EDGEGROVE_PASSWORD=login.password or "")
        self._submit_out = open(self.run_dir / "job-submit.log", "w+")  # noqa: SIM115 - the child's
        self._submit = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=self._submit_out, text=True, env=env)
        self.log.add("job", action="submit_start", job=self.job, pid=self._submit.pid)

    def check_submit(self, wait: float = 0.0) -> dict[str, int] | None:
        """None while `job submit` runs (waited for up to ``wait`` s) or after its outcome was
        taken; its assignments once it has run; RuntimeError (its line) if it failed."""
        proc = self._submit
        if proc is None:
            return None
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None
        self._submit = None
        assert proc.stdout is not None and self._submit_out is not None
        out = proc.stdout.read()
        proc.stdout.close()
        self._submit_out.seek(0)
        said = self._submit_out.read().strip()
        self._submit_out.close()
        if proc.returncode != 0:
            raise RuntimeError(said or f"edgegrove job submit exited with code {proc.returncode}")
        result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        assignments = {str(d): int(n) for d, n in result["assignments"].items()}
        self.log.add("job", action="submit", job=self.job, assignments=assignments,
                     file=str(self.job_path), fingerprint=result.get("fingerprint"), said=said)
        return assignments

    def confirm_submit(self, wait: float = 0.0) -> None:
        """`job submit`'s outcome, once it has one (RuntimeError: it failed or assigned the
        devices other node ids than the scenario's, which its faults name)."""
        assignments = self.check_submit(wait)
        if assignments is None:
            return
        expected = {name: node for node, name in enumerate(self.plan.names)}
        if assignments != expected:
            raise RuntimeError(f"job submit assigned {assignments}, not every device its node")
        say(f"simulate: job {self.job} submitted to {len(assignments)} devices")

    def stop_submit(self) -> None:
        if self._submit is not None and self._submit.poll() is None:
            self._submit.kill()
            self._submit.wait()

    def refused_nodes(self) -> set[int]:
        """Nodes whose device rejected the job (they will not come online)."""
        assert self.devices is not None
        return {n for n, name in enumerate(self.plan.names)
                if self.devices.state_of(name) == ExecState.REJECTED}

    def finished(self, fleet: Fleet, rounds_done: bool) -> bool:
        """Every device still running has ended its execution (a device killed and not yet
        restarted has not, unless the fleet is past its rounds); a SIGSTOPped one counts as
        ended once the fleet is past its rounds."""
        assert self.devices is not None
        for node, name in enumerate(self.plan.names):
            process = fleet.agents[node]
            state = self.devices.state_of(name)
            if state is not None and state.terminal:
                continue
            if rounds_done and (process.stopped or not process.running()):
                continue
            return False
        return True

    # -- after the job -----------------------------------------------------------------------

    def fetch_model(self) -> None:
        """The trained model into the run directory; a failure is said and logged, never
        raised (the run's report comes first)."""
        assert self.login is not None
        self.confirm_submit(wait=30.0)
        try:
            fetched = self.fetch(self.login)
        except Exception as exc:  # a failed fetch must not lose the run's report
            say(f"simulate: the trained model could not be fetched: {one_line(str(exc))}")
            self.log.add("job", action="fetch_failed", job=self.job, error=one_line(str(exc)))
            return
        say(f"simulate: trained model fetched into {fetched['dir']}: {', '.join(fetched['files'])}")

    def fetch(self, login: Login, wait: float = 30.0) -> dict[str, Any]:
        """`edgegrove job fetch JOB -o <run>/model` (its parser and its run): model.npz,
        model.tflite and metrics.json."""
        from agent.commands import job_fetch

        folder = self.run_dir / MODEL_DIR
        out = _operator_command(job_fetch, [self.job, "-o", str(folder), "--wait", str(wait),
                                            *_login_flags(login), "--json"], "job fetch")
        self.fetched = {"dir": str(folder), "files": sorted(Path(f).name for f in out["files"]),
                        "round": out.get("round"), "accuracy": out.get("accuracy"),
                        "notes": out.get("notes") or []}
        manifest = self.devices.result if self.devices is not None else None
        self.fetched["model_hash"] = None if manifest is None else manifest.model_hash
        self.log.add("job", action="fetch", job=self.job, **self.fetched)
        return self.fetched

    def summary(self) -> dict[str, Any]:
        """What the run's summary adds: each device's states, the fetched model."""
        states = self.devices.states() if self.devices is not None else {}
        return {"job_file": str(self.job_path), "devices": dict(sorted(states.items())),
                "model": self.fetched, "evaluate": self.evaluate_command()}

    def evaluate_command(self) -> str:
        """`edgegrove model evaluate` of the fetched model on the run's data, over as many test
        samples as the fleet evaluated (so its accuracy is the fleet's last reported one)."""
        source = self.plan.source
        data = f"--data {source.path}" if source.path is not None else f"--dataset {source.format}"
        if source.label_column is not None:
            data += f" --label-column {source.label_column}"
        limit = self.scenario.agent.get("eval_samples", 10000)
        return (f"edgegrove model evaluate {self.run_dir / MODEL_DIR / 'model.npz'} {data} "
                f"--limit {limit} --seed {self.scenario.agent.get('seed', 0)}")


def _device_login(logins: Mapping[str, Credentials], name: str) -> tuple[str, str] | None:
    """A device's user and password (None: a broker without logins)."""
    entry = logins.get(name)
    return None if entry is None else (entry.username, entry.password)


def _login_flags(login: Login) -> list[str]:
    flags = [f"--broker={login.url}"]  # KEY=VALUE: a password may start with "-"
    if login.username is not None:
        flags += [f"--username={login.username}", f"--password={login.password or ''}"]
    if login.ca_file is not None:
        flags += [f"--tls-ca={login.ca_file}"]
    return flags


def _operator_command(module: Any, argv: list[str], name: str) -> dict[str, Any]:
    """Run an operator command in this process as its CLI does (its own parser, its ``run``);
    its --json line, or RuntimeError with the line it said on failure."""
    parser = argparse.ArgumentParser(prog=f"edgegrove {name}")
    module.add_arguments(parser)
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            code = module.run(parser.parse_args(argv))
        except SystemExit as exc:  # argparse's own exit: never the simulator's
            code = exc.code if isinstance(exc.code, int) else 2
    said = stderr.getvalue().strip()
    if code != 0:
        raise RuntimeError(said or f"edgegrove {name} exited with code {code}")
    if said:
        print(said, file=sys.stderr)
    lines = [line for line in stdout.getvalue().splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1]))


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    (run_dir / "devices.json").write_text(json.dumps(summary, indent=2) + "\n")
