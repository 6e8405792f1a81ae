"""`edgegrove bench jobs`: five devices installed once run three jobs one after another.

One mosquitto (dynamic security; the devices' and the operator's users from make-credentials
--devices, made once), five `edgegrove device` processes, and three jobs submitted with
`edgegrove job submit`, each followed to its end, fetched with `edgegrove job fetch` and scored
with `edgegrove model evaluate`:

1. the thesis MLP on MNIST (iid),
2. the CNN ``.tflite`` (examples/mnist_cnn) on MNIST with dirichlet:0.5 (the file goes out as
   hash-checked chunks; the devices train it on ai-edge-litert),
3. the digits model (examples/digits) with the last device given no digits data source: it
   rejects the job (no_data_source) and the job runs on four.

For each job: the states every device went through, the fetched model's accuracy (npz and
.tflite, over the fleet's own evaluation samples) against the fleet's last reported one, and
that no device was restarted or given a new credential in between (pids, incarnations, config
and credential file hashes). Also each device's resident memory idle and while training.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.jobs import signing
from agent.protocol.topics import Topics
from simulate import brokers
from simulate.bench.common import (
    REPO_ROOT,
    add_output_arguments,
    document,
    emit,
    format_table,
    progress,
)
from simulate.device_setup import (
    DataSource,
    DeviceConfig,
    device_names,
    toml_document,
    write_device_config,
)
from simulate.device_watch import DeviceWatch
from simulate.fleet import AgentSpec, Fleet
from simulate.telemetry import Collector, EventLog, FleetWatch

EVAL_SAMPLES = 1000
DEVICE_MAIN = ("-m", "edgegrove.cli", "device")  # the command itself, no fault injector


@dataclass(frozen=True)
class JobCase:
    key: str
    model: str
    data: str
    partition: str
    batch: int
    lr: float
    rounds: int
    eval_every: int
    backend: str | None = None


def cases(args: argparse.Namespace) -> list[JobCase]:
    return [
        JobCase("mlp", "mlp", "mnist", "iid", 100, 0.001, args.rounds_mlp, 10),
        JobCase("cnn", str(REPO_ROOT / "examples" / "mnist_cnn" / "mnist_cnn.tflite"), "mnist",
                "dirichlet:0.5", 32, 0.001, args.rounds_cnn, 5, "litert"),
        JobCase("digits", f"{REPO_ROOT / 'examples' / 'digits' / 'model.py'}:factory", "digits", "iid",
                16, 0.003, args.rounds_digits, 10),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=int, default=5, help="device processes (the last has no digits)")
    parser.add_argument("--rounds-mlp", type=int, default=60, help="rounds of the thesis MLP job")
    parser.add_argument("--rounds-cnn", type=int, default=30, help="rounds of the CNN .tflite job")
    parser.add_argument("--rounds-digits", type=int, default=60, help="rounds of the digits job")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds allowed per job")
    parser.add_argument("--keep", type=Path, default=None, help="keep the work directory here")
    add_output_arguments(parser)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


class Bench:
    """The broker, the devices and the operator's files of one bench run."""

    def __init__(self, root: Path, devices: int) -> None:
        self.root = root
        self.names = device_names(devices)
        self.log = EventLog(root / "events.jsonl")
        self.watch = FleetWatch()
        self.key = root / "operator.key"
        self.broker: brokers.MosquittoBroker | None = None
        self.fleet: Fleet | None = None
        self.memory: dict[str, dict[str, float]] = {}

    def start(self, stack: ExitStack) -> None:
        mosq = self.broker = brokers.start_mosquitto(self.root / "broker", job="bench-jobs", nodes=0,
                                                     devices=self.names)
        stack.callback(mosq.stop)
        key = signing.generate_key()
        self.key.write_text(signing.private_key_text(key) + "\n")
        self.key.chmod(0o600)
        mnist, digits = DataSource("mnist", "mnist"), DataSource("digits", "digits")
        specs = []
        for node, name in enumerate(self.names):
            creds = mosq.device_credentials(name)
            sources = (mnist,) if node == len(self.names) - 1 else (mnist, digits)
            home = self.root / "devices" / name
            config = DeviceConfig(name, mosq.url, home / "state", signing.public_key_text(key), sources,
                                  {"site": "bench", "rack": str(node % 2)}, creds.username, creds.password)
            path = write_device_config(home / "device.toml", config)
            specs.append(AgentSpec(node, mosq.url, {}, home / "state", home / "device.log",
                                   device_config=path, device_main=DEVICE_MAIN))
        self.fleet = Fleet(specs)
        stack.callback(self.fleet.stop_all)
        self.fleet.start_all()

    def identity(self) -> dict[str, Any]:
        """What must not change between jobs: processes, incarnations, configs, credentials."""
        assert self.fleet is not None and self.broker is not None
        return {"pids": {self.names[n]: a.pid for n, a in self.fleet.agents.items()},
                "incarnations": {self.names[n]: a.incarnation for n, a in self.fleet.agents.items()},
                "configs": {n: _sha(self.root / "devices" / n / "device.toml") for n in self.names},
                "credentials": _sha(self.broker.credentials_path)}

    def operator_env(self) -> dict[str, str]:
        assert self.broker is not None
        creds = self.broker.operator_credentials
        return {**os.environ, "EDGEGROVE_BROKER": self.broker.url, "EDGEGROVE_USERNAME": creds.username,
                "EDGEGROVE_PASSWORD": creds.password, "EDGEGROVE_OPERATOR_KEY": str(self.key)}

    def watcher(self, job: str) -> DeviceWatch:
        assert self.broker is not None
        creds = self.broker.operator_credentials
        return DeviceWatch(self.broker.url, job, self.log, self.watch, creds.username, creds.password)

    def rss(self) -> dict[str, float]:
        """Each device process's resident memory now (MB)."""
        import psutil

        assert self.fleet is not None
        out = {}
        for node, agent in self.fleet.agents.items():
            if agent.pid is not None:
                out[self.names[node]] = psutil.Process(agent.pid).memory_info().rss / 2**20
        return out


def _cli(*argv: str, env: dict[str, str], timeout: float = 600) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "edgegrove.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"edgegrove {' '.join(argv[:2])}: {done.stderr.strip()[-800:]}")
    if done.stderr.strip():
        progress(done.stderr.strip())
    return dict(json.loads([ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]))


@contextmanager
def _peak_rss(bench: Bench) -> Iterator[dict[str, float]]:
    """Each device's peak resident memory while the block runs (sampled every 0.25 s)."""
    peaks: dict[str, float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            for name, mb in bench.rss().items():
                peaks[name] = max(peaks.get(name, 0.0), mb)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        done.set()
        thread.join()


def _job_file(bench: Bench, case: JobCase, job: str) -> Path:
    document_ = {"name": job, "model": case.model, "data": case.data, "partition": case.partition,
                 "batch": case.batch, "lr": case.lr, "min_devices": 2, "stop": {"rounds": case.rounds},
                 "devices": {"all": True}, "options": {"eval_every": case.eval_every,
                                                       "eval_samples": EVAL_SAMPLES, "join_grace": 60}}
    if case.backend is not None:
        document_["backend"] = case.backend
    path = bench.root / f"{job}.toml"
    path.write_text(toml_document(document_))
    return path


def run_job(bench: Bench, case: JobCase, timeout: float) -> dict[str, Any]:
    job = f"bench-{case.key}-{int(time.time())}"
    env = bench.operator_env()
    with ExitStack() as stack:
        devices = bench.watcher(job)
        devices.start()
        stack.callback(devices.stop)
        assert bench.broker is not None
        creds = bench.broker.operator_credentials
        telemetry = FleetWatch()
        collector = Collector(bench.broker.url, Topics(job), EventLog(None), telemetry, creds.username,
                              creds.password)
        collector.start()
        stack.callback(collector.stop)
        started = time.monotonic()
        progress(f"bench jobs: submitting {job} ({case.model.rsplit('/', 1)[-1]}, {case.data}, {case.partition})")
        submitted = _cli("job", "submit", str(_job_file(bench, case, job)), "--json", env=env)
        with _peak_rss(bench) as peaks:
            ended = devices.wait_for(lambda: len(devices.execs) == len(bench.names) and all(
                s.state.terminal for s in devices.execs.values()), timeout)
        seconds = time.monotonic() - started
        folder = bench.root / "models" / case.key
        fetched = _cli("job", "fetch", job, "-o", str(folder), "--wait", "60", "--json", env=env)
        last = max((t for t in telemetry.latest.values() if t.accuracy is not None),
                   key=lambda t: t.round, default=None)
        data = ["--dataset", case.data, "--limit", str(EVAL_SAMPLES)]
        npz = _cli("model", "evaluate", str(folder / "model.npz"), *data, "--json", env=env)
        tflite = _cli("model", "evaluate", str(folder / "model.tflite"), *data, "--json", env=env)
        return {"job": job, "case": case.key, "model": case.model.rsplit("/", 1)[-1], "data": case.data,
                "partition": case.partition, "rounds": case.rounds, "ended": ended,
                "seconds": round(seconds, 1), "assignments": submitted["assignments"],
                "states": devices.states(), "reasons": {d: str(s.reason) for d, s in devices.execs.items()
                                                        if s.reason is not None},
                "fleet_accuracy": None if last is None else last.accuracy,
                "fleet_accuracy_round": None if last is None else last.round,
                "result_accuracy": fetched.get("accuracy"), "result_round": fetched.get("round"),
                "evaluate_npz": npz["accuracy"], "evaluate_tflite": tflite["accuracy"],
                "files": sorted(Path(f).name for f in fetched["files"]),
                "peak_rss_mb": {k: round(v, 1) for k, v in sorted(peaks.items())}}


def run(args: argparse.Namespace) -> int:
    if args.devices < 3:
        progress("edgegrove bench jobs: --devices 3 or more")
        return 2
    if not brokers.mosquitto_available():
        progress("edgegrove bench jobs: needs mosquitto (scripts/setup.sh)")
        return 2
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-jobs-") as tmp, ExitStack() as stack:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        bench = Bench(root, args.devices)
        bench.start(stack)
        records = bench.watcher("bench-none")
        records.start()
        ready = records.wait_for(lambda: len(records.up(bench.names)) == len(bench.names), 120)
        records.stop()
        if not ready:
            progress(f"bench jobs: the devices did not come up; see {root / 'devices'}")
            return 1
        time.sleep(2.0)  # the devices settle after their start (imports done, record sent)
        idle = bench.rss()
        before = bench.identity()
        results = [run_job(bench, case, args.job_timeout) for case in cases(args)]
        after = bench.identity()
        idle_after = bench.rss()
        doc = document("jobs", devices=bench.names, results=results, identity_before=before,
                       identity_after=after, unchanged=before == after,
                       idle_rss_mb={k: round(v, 1) for k, v in idle.items()},
                       idle_rss_after_mb={k: round(v, 1) for k, v in idle_after.items()},
                       method=("one mosquitto with dynamic security; `edgegrove device` x N (credentials "
                               "from make-credentials --devices, made once); each job submitted with "
                               "`edgegrove job submit`, fetched with `job fetch`, scored with "
                               f"`model evaluate --limit {EVAL_SAMPLES}` (the fleet's evaluation "
                               "samples); fleet accuracy = its last telemetry with an accuracy"))
        emit(doc, args, render_table(doc))
    ok = all(r["ended"] for r in results) and before == after
    return 0 if ok else 1


def render_table(doc: dict[str, Any]) -> str:
    rows, states = [], []
    for r in doc["results"]:
        rows.append([r["case"], r["model"], r["partition"], r["rounds"], r["seconds"], len(r["assignments"]),
                     r["fleet_accuracy"], r["fleet_accuracy_round"], r["result_accuracy"], r["evaluate_npz"],
                     r["evaluate_tflite"], max(r["peak_rss_mb"].values(), default=None)])
        for device, went in sorted(r["states"].items()):
            why = f" ({r['reasons'][device]})" if device in r["reasons"] else ""
            states.append(f"  {r['case']:<7} {device}: {' > '.join(went)}{why}")
    table = format_table(["job", "model", "partition", "rounds", "s", "devices", "fleet acc", "at round",
                          "result acc", "evaluate npz", "evaluate tflite", "peak RSS MB"], rows)
    return (f"{table}\n\nstates:\n" + "\n".join(states)
            + f"\n\nidle device RSS MB: {doc['idle_rss_mb']}\nafter three jobs: {doc['idle_rss_after_mb']}\n"
            f"no restart, no new credential: {doc['unchanged']} (pids {doc['identity_after']['pids']})")
