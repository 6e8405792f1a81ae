#!/usr/bin/env python3
"""Resident memory of a device process (idle, and training the thesis MLP) against today's
`edgegrove agent` training the same job, on one mosquitto (issue 52's bar: within 10 MB).

    PYTHONPATH=. .venv/bin/python scripts/device_memory.py [--nodes 2] [--rounds 40]

Each side runs ``--nodes`` processes of the thesis MLP on the full MNIST (each its 1/n shard,
batch 100, Adam, ft-tree), the same job; RSS is sampled from /proc every 0.1 s and the peak
(VmHWM) read before each process ends. Prints one line per figure, MB = 2**20 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.jobs import signing, topics  # noqa: E402
from agent.jobs.document import JobSpec  # noqa: E402
from agent.transport.mqtt import MqttTransport  # noqa: E402

MB = 2**20
ENDED = ("succeeded", "failed", "rejected", "canceled", "timed_out")


def status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Sampler:
    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self.hwm = dict.fromkeys(pids, 0)

    def sample(self) -> None:
        for pid in self.pids:
            self.peak[pid] = max(self.peak[pid], status_kb(pid, "VmRSS"))
            self.hwm[pid] = max(self.hwm[pid], status_kb(pid, "VmHWM"))


def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:  # a free port (the simulator's helpers are not for scripts)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n")
    binary = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    assert binary, "mosquitto is not installed"
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc, f"mqtt://127.0.0.1:{port}"


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def agents(url: str, nodes: int, rounds: int, workdir: Path) -> list[int]:
    procs = [subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "agent", "--id", str(i), "--fleet-size", str(nodes), "--job", "base",
         "--broker", url, "--rounds", str(rounds), "--eval-every", "10", "--eval-samples", "10000"],
        env=env(), stdout=(workdir / f"agent-{i}.log").open("wb"), stderr=subprocess.STDOUT) for i in range(nodes)]
    sampler = Sampler([p.pid for p in procs])
    while any(p.poll() is None for p in procs):
        sampler.sample()
        time.sleep(0.1)
    return [max(sampler.peak[p.pid], sampler.hwm[p.pid]) for p in procs]


def devices(url: str, nodes: int, rounds: int, workdir: Path) -> tuple[list[int], list[int], list[int]]:
    key = signing.generate_key()
    names = [f"dev-{i}" for i in range(nodes)]
    procs = []
    for name in names:
        home = workdir / name
        home.mkdir()
        (home / "device.toml").write_text(
            f'id = "{name}"\nbroker = "{url}"\noperator_keys = ["{signing.public_key_text(key)}"]\n'
            f'state_dir = "{home / "state"}"\n[data.mnist]\nformat = "mnist"\n')
        procs.append(subprocess.Popen([sys.executable, "-m", "agent.cli", "device", "--config", str(home / "device.toml")],
                                      env=env(), stdout=(home / "device.log").open("wb"), stderr=subprocess.STDOUT))
    watch = MqttTransport("bench-watch", url, threaded=True)
    watch.connect([topics.all_device_records(), topics.all_execs()])
    states: dict[str, str] = {}
    ended: set[str] = set()

    def pump(timeout: float) -> None:
        for m in watch.receive(timeout):
            if not m.payload:
                continue
            if (d := topics.parse_device_record(m.topic)) is not None:
                states[d] = json.loads(m.payload)["state"]
            elif (pair := topics.parse_job_exec(m.topic)) is not None and json.loads(m.payload)["state"] in ENDED:
                ended.add(pair[1])

    while sum(s == "idle" for s in states.values()) < nodes:
        pump(0.2)
    time.sleep(3.0)  # idle, settled
    idle = [status_kb(p.pid, "VmRSS") for p in procs]
    spec = JobSpec.model_validate({"name": "devjob", "data": "mnist", "stop": {"rounds": rounds},
                                   "assignments": {n: i for i, n in enumerate(names)},
                                   "agent_options": {"eval_every": 10, "eval_samples": 10000},
                                   "submitted_at": time.time()})
    op = MqttTransport("bench-op", url, threaded=True)
    op.connect([])
    op.publish(topics.job_spec("devjob"), signing.envelope_bytes(signing.sign(spec, key)), retain=True, reliable=True)
    sampler = Sampler([p.pid for p in procs])
    while len(ended) < nodes:
        sampler.sample()
        pump(0.1)
    time.sleep(3.0)
    after = [status_kb(p.pid, "VmRSS") for p in procs]
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)
    watch.close()
    op.close()
    return idle, [max(sampler.peak[p.pid], sampler.hwm[p.pid]) for p in procs], after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgegrove-devmem-") as tmp:
        workdir = Path(tmp)
        broker, url = start_broker(workdir)
        try:
            agent_peak = agents(url, args.nodes, args.rounds, workdir)
            idle, training, after = devices(url, args.nodes, args.rounds, workdir)
        finally:
            broker.terminate()
            broker.wait(10)
    fmt = lambda values: " ".join(f"{v / MB:.1f}" for v in values)  # noqa: E731
    print(f"thesis MLP on MNIST, {args.nodes} nodes, {args.rounds} rounds, batch 100, numpy backend")
    print(f"edgegrove agent   peak RSS MB: {fmt(agent_peak)}")
    print(f"edgegrove device  idle RSS MB: {fmt(idle)}")
    print(f"edgegrove device  peak RSS MB training: {fmt(training)}")
    print(f"edgegrove device  RSS MB after the job (idle again): {fmt(after)}")
    print(f"device training - agent (peak, MB): {(max(training) - max(agent_peak)) / MB:+.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
