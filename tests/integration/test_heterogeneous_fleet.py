"""Issue 15: the agent on a Raspberry Pi's architecture, in a fleet of x86 agents.

The aarch64 agent is the agent as a user installs it: a wheel of this tree, installed with only
the ``litert`` extra from aarch64 wheels into a site directory, run by an aarch64 Python 3.11
(Debian's) under qemu user-mode emulation (``scripts/arm64-env.sh``; its userland is built into
~/.cache/edgegrove/arm64 on first use, ~1 min). Real mosquitto; 2 x86 agents on numpy, the
aarch64 agent (numpy, an inner node of the tree) and an x86 agent on LiteRT (its child).

If qemu or the userland cannot be had, these tests FAIL with the reason: they are never skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from simulate.bench.arm64 import (
    INSTALL_TIMEOUT,
    Arm64AgentSpec,
    Arm64Error,
    Arm64Site,
    install_site,
)
from simulate.brokers import MosquittoBroker, start_mosquitto
from simulate.fleet import AgentSpec, Fleet
from tests.integration.fleet_harness import FAST_AGENT, FleetListener

# Whichever test runs first also builds the aarch64 userland and site (fixture time counts).
pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(INSTALL_TIMEOUT * 2 + 1200)]

JOB = "hetero"
NODES = 4
ARM_NODE = 1  # inner node: it merges its child's (the LiteRT agent's) chunks on aarch64
LITERT_NODE = 3  # child of node 1 in the binary tree 0 -> (1, 2), 1 -> 3
ROUNDS = 6
# What the agent must not pull in on a device: the simulator's and the dashboard's dependencies.
NOT_ON_A_DEVICE = ("matplotlib", "fastapi", "uvicorn", "iotcore", "psutil", "starlette", "httpx")
# Emulated aarch64 runs ~10-20x slower than native: generous timeouts everywhere for it.
AGENT_OPTIONS = {
    **FAST_AGENT,
    "fleet_size": NODES,
    "min_members": NODES,  # round 0 waits for the emulated agent: no late join, no resync
    "join_grace": 600.0,
    "rounds": ROUNDS,
    # The emulated agent's round takes ~1 s here when the machine is quiet; a busy machine can
    # make it several times that. Fixed, long timeouts: a late ACK must not look like a fault.
    "timeout_mode": "fixed",
    "timeout": 10.0,
    "round_deadline": 120.0,
    "checkpoint_every": 1000,  # only the final one (written when the round budget is done)
    "keepalive": 60,
}


@pytest.fixture(scope="module")
def arm64_site(tmp_path_factory: pytest.TempPathFactory) -> Arm64Site:
    """The agent installed from its wheel into an aarch64 site (the userland built if missing)."""
    started = time.monotonic()
    try:
        site = install_site(tmp_path_factory.mktemp("arm64") / "site")
    except Arm64Error as exc:
        pytest.fail(str(exc))
    print(f"\naarch64 install ({time.monotonic() - started:.0f} s, userland "
          f"{'built' if site.built_userland else 'cached'}): {site.pip_line}")
    return site


def test_the_agent_wheel_installs_and_runs_on_aarch64_without_the_simulator(
    arm64_site: Arm64Site, tmp_path: Path
) -> None:
    pulled = arm64_site.pip_line
    assert pulled.startswith("Successfully installed "), pulled
    names = {p.rsplit("-", 1)[0].lower().replace("_", "-") for p in pulled.split()[2:]}
    assert {"edgegrove", "numpy", "paho-mqtt", "pydantic", "ai-edge-litert", "flatbuffers"} <= names
    assert not names & set(NOT_ON_A_DEVICE), f"the agent's install pulled in {names & set(NOT_ON_A_DEVICE)}"

    where = arm64_site.python("-c", "import platform, agent, numpy._core._multiarray_umath as m, "
                                    "ai_edge_litert.interpreter as i; "
                                    "print(platform.machine(), agent.__file__, m.__file__, i.__file__)")
    assert where.returncode == 0, where.stderr
    machine, *files = where.stdout.split()
    assert machine == "aarch64"
    # The wheel's agent, not this tree; numpy's compiled core is an aarch64 build.
    assert all(f.startswith(str(arm64_site.path)) for f in files), files
    assert files[1].endswith("-aarch64-linux-gnu.so"), files[1]

    overview = arm64_site.edgegrove("--help", cwd=tmp_path)
    assert overview.returncode == 0 and "agent" in overview.stdout, overview.stderr
    agent_help = arm64_site.edgegrove("agent", "--help", cwd=tmp_path)
    assert agent_help.returncode == 0, agent_help.stderr
    assert "--backend {numpy,litert}" in agent_help.stdout
    # Nor can the aarch64 Python find them anywhere (its site is only what pip installed).
    found = arm64_site.python("-c", "import importlib.util as u, sys; "
                                    f"print([m for m in {list(NOT_ON_A_DEVICE)!r} if u.find_spec(m)])")
    assert found.returncode == 0 and found.stdout.strip() == "[]", (found.stdout, found.stderr)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=NODES) as b:
        yield b


def _spec(broker: MosquittoBroker, tmp_path: Path, node: int, backend: str,
          site: Arm64Site | None = None) -> AgentSpec:
    options = {**AGENT_OPTIONS, "job": JOB, "backend": backend,
               "credentials": str(broker.credentials_path)}
    common = {"node": node, "broker_url": broker.url, "options": options,
              "checkpoint_dir": tmp_path / f"ckpt-{node}", "log_path": tmp_path / f"agent-{node}.log"}
    if site is None:
        return AgentSpec(**common)
    return Arm64AgentSpec(**common, site=site.path)


def _logs(tmp_path: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(tmp_path.glob("agent-*.log")))


def test_an_aarch64_agent_and_a_litert_agent_train_bit_identical_with_x86_numpy_agents(
    arm64_site: Arm64Site, broker: MosquittoBroker, tmp_path: Path
) -> None:
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = Fleet([_spec(broker, tmp_path, n, "litert" if n == LITERT_NODE else "numpy",
                         arm64_site if n == ARM_NODE else None) for n in range(NODES)])
    started = time.monotonic()
    fleet.start_all()
    try:
        listener.wait_for(lambda: listener.reached(list(range(NODES)), ROUNDS - 1), 900,
                          f"{ROUNDS} rounds on every agent")
        elapsed = time.monotonic() - started
        # The final checkpoint is written before the last round's telemetry; after it an agent
        # lingers (round deadline + 3 timeouts) to serve late peers: SIGTERM ends that cleanly.
        assert not fleet.running_nodes() or all(
            (tmp_path / f"ckpt-{n}" / "checkpoint.npz").exists() for n in range(NODES))
    finally:
        forced = fleet.stop_all(grace=30)
        listener.close()
    assert forced == [], f"agents did not exit on SIGTERM: {forced}\n{_logs(tmp_path)}"
    codes = {n: a.popen.returncode for n, a in fleet.agents.items() if a.popen is not None}
    assert set(codes.values()) == {0}, f"exit codes {codes}\n{_logs(tmp_path)}"

    telemetry = {n: [t for t in listener.telemetry[n] if t.round < ROUNDS] for n in range(NODES)}
    machines = {n: {t.machine for t in ts} for n, ts in telemetry.items()}
    assert machines[ARM_NODE] == {"aarch64"}, machines
    assert all(machines[n] == {"x86_64"} for n in range(NODES) if n != ARM_NODE), machines
    assert "XNNPACK" in (tmp_path / f"agent-{LITERT_NODE}.log").read_text(), "node 3 is not on LiteRT"

    rounds = {n: sorted(t.round for t in ts) for n, ts in telemetry.items()}
    assert all(r == list(range(ROUNDS)) for r in rounds.values()), f"missing rounds: {rounds}"
    degraded = {n: [t.round for t in ts if t.degraded] for n, ts in telemetry.items()}
    assert not any(degraded.values()), f"degraded rounds: {degraded}\n{_logs(tmp_path)}"
    resyncs = {n: [(t.round, e) for t in ts if t.round >= 1 for e in t.events
                   if e.get("kind") in ("resync", "drift", "rejoin", "behind", "state_pull_failed")]
               for n, ts in telemetry.items()}
    assert not any(resyncs.values()), f"state transfers after round 0: {resyncs}"
    for r in range(ROUNDS):
        hashes = listener.hashes_at(r)
        assert len(hashes) == NODES and len(set(hashes.values())) == 1, f"round {r}: {hashes}"
    assert listener.hashes_at(0) != listener.hashes_at(ROUNDS - 1)  # it trained

    # The final checkpoints: params AND Adam's state, to the bit, on all four.
    states = {n: np.load(tmp_path / f"ckpt-{n}" / "checkpoint.npz")["state"] for n in range(NODES)}
    reference = states[0].tobytes()
    assert all(s.tobytes() == reference for s in states.values()), {
        n: int(np.sum(s != states[0])) for n, s in states.items()}
    arm_rounds = [t.phase_seconds.get("total", 0.0) for t in telemetry[ARM_NODE]]
    print(f"\n{NODES} agents ({ROUNDS} rounds, {elapsed:.0f} s from the aarch64 agent's start): "
          f"machines { {n: sorted(m)[0] for n, m in machines.items()} }, node {LITERT_NODE} on "
          f"LiteRT; final state {len(states[0])} float32 values bit-identical on all "
          f"(crc {listener.hashes_at(ROUNDS - 1)[0]}); round times on aarch64 (s): "
          f"{[round(s, 2) for s in arm_rounds]}; python {sys.version.split()[0]} (x86)")


def test_bench_agent_reports_the_machine_and_peak_memory_of_an_aarch64_agent(
    arm64_site: Arm64Site,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edgegrove.cli", "bench", "agent", "--nodes", "2", "--rounds", "4",
         "--aarch64", "1", "--arm64-site", str(arm64_site.path), "--timeout", "600", "--json"],
        capture_output=True, text=True, timeout=900, check=False, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["machines"] == {"0": "x86_64", "1": "aarch64"}, result
    assert result["emulated"] == ["1"]
    # qemu's process holds the aarch64 Python, numpy and the model: more than a bare emulator.
    assert 50 < result["peak_rss_mb"]["1"] < 2000, result
    assert 20 < result["peak_rss_mb"]["0"] < result["pi_budget_mb"], result
    print(f"\nbench agent with an aarch64 agent: machines {result['machines']}, peak RSS MB "
          f"{result['peak_rss_mb']} (the aarch64 figure is qemu's process, guest included)")


APPLY_SCRIPT = """
import sys
import numpy as np
from agent.model.backend import make_backend
from agent.model.optim import scheduled_lr

data = np.load(sys.argv[1])
out = {}
for optimizer in ("adam", "sgd"):
    for name in ("numpy", "litert"):
        backend = make_backend(name, np.random.default_rng(11), optimizer)
        for step, grad in enumerate(data["gradients"]):
            backend.set_learning_rate(scheduled_lr(0.01, step, len(data["gradients"]), "linear"))
            backend.apply(grad)
        out[f"{optimizer}-{name}"] = backend.state()
np.savez(sys.argv[2], **out)
"""


def test_the_optimizer_steps_give_the_same_bits_on_aarch64_and_x86_for_both_backends(
    arm64_site: Arm64Site, tmp_path: Path
) -> None:
    """The optimizer step alone, 20 steps of Adam and SGD from the same gradients: x86 numpy,
    x86 LiteRT, aarch64 numpy and aarch64 LiteRT must end with the same state bytes."""
    rng = np.random.default_rng(5)
    gradients = (rng.standard_normal((20, 407050)) * rng.uniform(1e-4, 1.0, (20, 1))).astype(np.float32)
    np.savez(tmp_path / "gradients.npz", gradients=gradients)
    script = tmp_path / "apply.py"
    script.write_text(APPLY_SCRIPT)
    for where, run in (("x86_64", [sys.executable]),
                       ("aarch64", None)):
        target = tmp_path / f"{where}.npz"
        if run is None:
            done = arm64_site.python(str(script), str(tmp_path / "gradients.npz"), str(target), timeout=600)
        else:
            done = subprocess.run([*run, str(script), str(tmp_path / "gradients.npz"), str(target)],
                                  capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"{where}: {done.stderr[-3000:]}"
    x86, arm = np.load(tmp_path / "x86_64.npz"), np.load(tmp_path / "aarch64.npz")
    for optimizer in ("adam", "sgd"):
        reference = x86[f"{optimizer}-numpy"]
        assert reference[407050] == 20  # the step count: it ran
        for label, state in ((f"x86_64 litert {optimizer}", x86[f"{optimizer}-litert"]),
                             (f"aarch64 numpy {optimizer}", arm[f"{optimizer}-numpy"]),
                             (f"aarch64 litert {optimizer}", arm[f"{optimizer}-litert"])):
            differing = int(np.sum(state != reference))
            assert differing == 0, f"{label}: {differing} values differ from x86_64 numpy"
