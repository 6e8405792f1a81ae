"""A real Flower 1.42 deployment on this host, every process started and stopped by handle.

One ``flower-superlink`` and N ``flower-supernode`` processes (insecure mode, 127.0.0.1, free
ports), each SuperNode behind its own user-space TCP proxy (``simulate.proxy``) that counts
its bytes and can limit its link. ``flwr run`` submits the Flower App in
``simulate/bench/flower_app`` (our MLP, MNIST shards and Adam; FedAvg over all nodes).

Flower's processes run from the ``peers`` environment (``.venv-peers`` made by
``scripts/setup.sh --dev``): flwr 1.42 pins older fastapi, starlette, uvicorn and protobuf
than the project's, so it is kept out of the project's environment. Every Flower process gets
PYTHONPATH = this checkout (the app imports ``agent.model``), one BLAS thread, no telemetry,
no update check, no dependency installation at run time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from simulate.bench.common import REPO_ROOT, progress
from simulate.proxy import TcpProxy

FLWR_VERSION = "1.42.0"
APP_DIR = Path(__file__).resolve().parent / "flower_app"
PEERS_VENV_ENV = "EDGEGROVE_PEERS_VENV"
DEFAULT_PEERS_VENV = REPO_ROOT / ".venv-peers"
SETUP_HINT = "run scripts/setup.sh --dev (it makes .venv-peers with flwr==1.42.0)"
STOP_GRACE_S = 5.0
READY_TIMEOUT_S = 120.0


class FlowerMissing(Exception):
    """flwr 1.42.0 is not installed where the bench looks; the message says how to get it."""


def find_flower_bin(venv: Path | None) -> Path:
    """The bin directory holding flower-superlink/-supernode/flwr 1.42.0: ``venv`` if given,
    else $EDGEGROVE_PEERS_VENV, else .venv-peers of the checkout, else this interpreter's own."""
    candidates = [venv] if venv is not None else [
        Path(p) for p in (os.environ.get(PEERS_VENV_ENV), DEFAULT_PEERS_VENV) if p]
    dirs = [c / "bin" for c in candidates]
    if venv is None:
        dirs.append(Path(sys.executable).parent)
    for bin_dir in dirs:
        if (bin_dir / "flower-superlink").is_file():
            version = _flwr_version(bin_dir)
            if version == FLWR_VERSION:
                return bin_dir
            raise FlowerMissing(f"{bin_dir} has flwr {version}, the bench needs {FLWR_VERSION}: {SETUP_HINT}")
    raise FlowerMissing(f"flwr {FLWR_VERSION} not found (looked in {', '.join(map(str, dirs))}): {SETUP_HINT}")


def _flwr_version(bin_dir: Path) -> str | None:
    python = bin_dir / "python"
    done = subprocess.run([str(python), "-c", "import flwr; print(flwr.__version__)"],
                          capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip() or None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class FlowerSettings:
    """The speed settings given to Flower (see ``TUNING`` in simulate/bench/flower.py)."""

    isolation: str = "subprocess"
    superexec_poll_s: float = 0.1  # FLWR_SUPEREXEC_TASK_POLL_INTERVAL (stock 1.0 s)
    server_poll_s: float = 0.1  # our ServerApp's reply polling (Grid.send_and_receive: 3 s)
    database: bool = True  # SuperLink state in a file, so that a restarted SuperLink has it


@dataclass
class Managed:
    """One process we started, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]

    def tree(self) -> list[psutil.Process]:
        """The process and its descendants now (what a crash of its machine would take)."""
        try:
            root = psutil.Process(self.popen.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []


@dataclass
class FlowerDeployment:
    """SuperLink + N SuperNodes behind proxies; ``submit`` starts a run of the app."""

    work: Path
    nodes: int
    bin_dir: Path
    settings: FlowerSettings = field(default_factory=FlowerSettings)
    superlink: Managed | None = None
    supernodes: dict[int, Managed] = field(default_factory=dict)
    proxies: dict[int, TcpProxy] = field(default_factory=dict)
    port: int = 0
    orphans: set[int] = field(default_factory=set)  # pids left by a killed process tree
    _incarnation: dict[str, int] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PATH=f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(REPO_ROOT),
            FLWR_HOME=str(self.work / "flwr-home"), FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            FLWR_SUPEREXEC_TASK_POLL_INTERVAL=str(self.settings.superexec_poll_s),
            OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        return env

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._write_flower_config()
        self.start_superlink()
        for node in range(self.nodes):
            proxy = TcpProxy("127.0.0.1", self.port, name=f"flower-proxy-{node}")
            proxy.start()
            self.proxies[node] = proxy
            self.start_supernode(node)

    def _spawn(self, name: str, command: list[str]) -> Managed:
        count = self._incarnation.get(name, 0)
        self._incarnation[name] = count + 1
        log = (self.work / f"{name}.{count}.log").open("wb")
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                 cwd=self.work, start_new_session=True)
        return Managed(name, popen, log)

    def start_superlink(self) -> None:
        command = [str(self.bin_dir / "flower-superlink"), "--insecure", "--host", "127.0.0.1",
                   "--port", str(self.port), "--isolation", self.settings.isolation,
                   "--disable-runtime-dependency-installation"]
        if self.settings.database:
            command += ["--database", str(self.work / "superlink.db")]
        self.superlink = self._spawn("superlink", command)
        self.wait_ready()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.superlink is not None and self.superlink.popen.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {self.superlink.popen.returncode}; "
                                   f"see {self.work}/superlink.*.log")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                if r.status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"flower-superlink did not answer on port {self.port} within {timeout:.0f} s")

    def start_supernode(self, node: int) -> None:
        command = [str(self.bin_dir / "flower-supernode"), "--insecure",
                   "--superlink", f"127.0.0.1:{self.proxies[node].port}",
                   "--port", str(free_port()), "--isolation", self.settings.isolation,
                   "--node-config", f"partition-id={node} num-partitions={self.nodes}"]
        self.supernodes[node] = self._spawn(f"supernode-{node}", command)

    def kill_tree(self, managed: Managed) -> None:
        """SIGKILL the process and every descendant (a crash of the machine it runs on)."""
        for proc in managed.tree():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        managed.popen.wait()
        managed.log.close()

    def kill_superlink_only(self) -> None:
        """SIGKILL the SuperLink process alone (its SuperExec and ServerApp are left running,
        as when only the SuperLink crashes); their pids are kept for the final clean-up."""
        assert self.superlink is not None
        self.orphans.update(p.pid for p in self.superlink.tree()[1:])
        self.superlink.popen.kill()
        self.superlink.popen.wait()
        self.superlink.log.close()

    def client_trees(self) -> dict[int, list[psutil.Process]]:
        return {node: m.tree() for node, m in self.supernodes.items() if m.popen.poll() is None}

    def proxy_bytes(self) -> int:
        return sum(p.bytes_up[0] + p.bytes_down[0] for p in self.proxies.values())

    def submit(self, run_config: dict[str, Any], attempts: int = 5) -> str:
        """``flwr run`` the app with ``run_config``; the run id. Retried: a just-started
        SuperLink on a busy host can refuse the first requests."""
        pairs = " ".join(f"{k}={_toml(v)}" for k, v in run_config.items())
        command = [str(self.bin_dir / "flwr"), "run", str(APP_DIR), "bench", "--run-config", pairs,
                   "--format", "json"]
        last = ""
        for _ in range(attempts):
            done = subprocess.run(command, capture_output=True, text=True, env=self.env(),
                                  cwd=self.work, timeout=300, check=False)
            with contextlib.suppress(ValueError):
                answer = json.loads(done.stdout[done.stdout.find("{"):])
                if answer.get("success"):
                    return str(answer["run-id"])
            last = ((done.stdout + done.stderr).strip().splitlines() or ["no output"])[-1]
            progress(f"  flwr run failed ({last[:120]}); retrying")
            time.sleep(3)
        raise RuntimeError(f"flwr run failed {attempts} times: {last}")

    def _write_flower_config(self) -> None:
        home = self.work / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')

    def stop(self) -> None:
        """Every process we started or left behind: SIGTERM, a grace period, SIGKILL."""
        procs: list[psutil.Process] = []
        for managed in [self.superlink, *self.supernodes.values()]:
            if managed is not None:
                procs += managed.tree()
        for pid in self.orphans:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=STOP_GRACE_S)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=STOP_GRACE_S)
        for managed in [self.superlink, *self.supernodes.values()]:
            if managed is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    managed.popen.wait(1)
                managed.log.close()
        for proxy in self.proxies.values():
            proxy.stop()


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "") + "'"
