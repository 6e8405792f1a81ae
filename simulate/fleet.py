"""The fleet launcher: one agent process per node (``simulate.faulty_agent``: `edgegrove agent`
with the fault injector), supervised by handle.

Agents run in their own session (``start_new_session``) so that a Ctrl-C in the terminal
reaches only the simulator, which then stops every agent itself: SIGCONT (a stopped process
cannot act on SIGTERM), SIGTERM, a grace period, SIGKILL for what is left. Processes are only
ever signalled through the handles kept here, never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

AGENT_MODULE = "simulate.faulty_agent"  # what the launcher runs: the agent with the fault injector
DEVICE_MODULE = "simulate.faulty_device"  # or, through devices: the device with the fault injector

@dataclass(frozen=True)
class AgentSpec:
    """How to start agent ``node``; ``prefix`` wraps the command (e.g. ``ip netns exec NS``).
    With ``device_config`` the process is the device of that config (it runs node ``node``
    of the job it is given; ``checkpoint_dir`` is its state directory) instead of an agent."""

    node: int
    broker_url: str
    options: Mapping[str, Any]
    checkpoint_dir: Path
    log_path: Path
    prefix: tuple[str, ...] = ()
    device_config: Path | None = None
    device_main: tuple[str, ...] = ("-m", DEVICE_MODULE)  # how python starts the device

    def command(self) -> list[str]:
        if self.device_config is not None:
            return [*self.prefix, sys.executable, *self.device_main, "--config", str(self.device_config)]
        args = [sys.executable, "-m", AGENT_MODULE, "--id", str(self.node),
                "--broker", self.broker_url, "--checkpoint-dir", str(self.checkpoint_dir)]
        args += options_to_flags(self.options)
        return [*self.prefix, *args]


def options_to_flags(options: Mapping[str, Any]) -> list[str]:
    """{"timeout_mode": "fixed", "non_iid": True} -> ["--timeout-mode", "fixed", "--non-iid"]."""
    flags: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            flags += [flag, str(value)]
    return flags


@dataclass
class AgentProcess:
    spec: AgentSpec
    popen: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    stopped: bool = False  # SIGSTOPped by us
    killed: bool = False  # SIGKILLed by us (a crash fault), not yet respawned
    exit_codes: list[int] = field(default_factory=list)
    _log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Fleet:
    """Start, signal, respawn and stop the agent processes of one run."""

    def __init__(self, specs: Sequence[AgentSpec], env: Mapping[str, str] | None = None,
                 on_event: Callable[[str, dict[str, Any]], object] | None = None) -> None:
        self.agents = {s.node: AgentProcess(s) for s in specs}
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.env.setdefault("OPENBLAS_NUM_THREADS", "1")  # N agents share the cores: no BLAS threads
        self._on_event = on_event or (lambda kind, data: None)

    # -- lifecycle -----------------------------------------------------------------------

    def start_all(self) -> None:
        for node in self.agents:
            self.spawn(node)

    def spawn(self, node: int) -> int:
        """Start (or restart) agent ``node``; returns its pid."""
        agent = self.agents[node]
        if agent.running():
            raise RuntimeError(f"agent {node} is still running (pid {agent.pid})")
        spec = agent.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if agent._log is not None:
            agent._log.close()
        agent._log = open(spec.log_path, "ab")  # noqa: SIM115 - kept open for the child's life
        agent._log.write(f"--- incarnation {agent.incarnation + 1}: {' '.join(spec.command())}\n".encode())
        agent._log.flush()
        agent.popen = subprocess.Popen(
            spec.command(), stdin=subprocess.DEVNULL, stdout=agent._log, stderr=subprocess.STDOUT,
            env=self.env, start_new_session=True,
        )
        agent.incarnation += 1
        agent.stopped = agent.killed = False
        self._on_event("spawn", {"node": node, "pid": agent.popen.pid, "incarnation": agent.incarnation})
        return agent.popen.pid

    def kill(self, node: int) -> None:
        """SIGKILL: a crash. The broker's Last Will announces it."""
        agent = self.agents[node]
        if agent.popen is None or not agent.running():
            return
        agent.popen.send_signal(signal.SIGKILL)
        agent.popen.wait()
        agent.killed, agent.stopped = True, False
        self._record_exit(agent)

    def pause(self, node: int) -> None:
        """SIGSTOP: the process hangs with its socket open (silent to its peers)."""
        agent = self.agents[node]
        if agent.popen is not None and agent.running():
            agent.popen.send_signal(signal.SIGSTOP)
            agent.stopped = True

    def resume(self, node: int) -> None:
        agent = self.agents[node]
        if agent.popen is not None and agent.running() and agent.stopped:
            agent.popen.send_signal(signal.SIGCONT)
            agent.stopped = False

    def stop_all(self, grace: float = 10.0) -> list[int]:
        """SIGCONT + SIGTERM every running agent, SIGKILL after ``grace`` s; returns the pids
        that had to be killed."""
        running = [a for a in self.agents.values() if a.running()]
        for agent in running:
            assert agent.popen is not None
            if agent.stopped:
                agent.popen.send_signal(signal.SIGCONT)
                agent.stopped = False
            agent.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        forced: list[int] = []
        for agent in running:
            assert agent.popen is not None
            try:
                agent.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                forced.append(agent.popen.pid)
                agent.popen.kill()
                agent.popen.wait()
            self._record_exit(agent)
        for agent in self.agents.values():
            if agent._log is not None:
                agent._log.close()
                agent._log = None
        return forced

    # -- queries -------------------------------------------------------------------------

    def poll_exits(self) -> list[tuple[int, int]]:
        """(node, exit code) of agents that exited since the last call, not killed by us."""
        exited = []
        for node, agent in self.agents.items():
            if agent.popen is not None and agent.popen.poll() is not None and not agent.killed:
                code = agent.popen.returncode
                if len(agent.exit_codes) < agent.incarnation:
                    self._record_exit(agent)
                    exited.append((node, code))
        return exited

    def running_nodes(self) -> list[int]:
        return [n for n, a in self.agents.items() if a.running()]

    def pids(self) -> list[int]:
        """Every pid this fleet has started that may still exist (for leak checks)."""
        return [a.pid for a in self.agents.values() if a.pid is not None]

    def _record_exit(self, agent: AgentProcess) -> None:
        if agent.popen is None or len(agent.exit_codes) >= agent.incarnation:
            return
        code = agent.popen.returncode
        agent.exit_codes.append(code)
        self._on_event("exit", {"node": agent.spec.node, "pid": agent.popen.pid, "code": code,
                                "incarnation": agent.incarnation})
