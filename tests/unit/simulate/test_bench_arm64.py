"""The Raspberry Pi /proc/cpuinfo that LiteRT's CPU detection reads under qemu: one processor
block per CPU id the host's /sys lists (cpuinfo reads those from the host). The site's install
steps, scripts/arm64-env.sh replaced (no qemu, no wheel)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from simulate.bench import arm64
from simulate.bench.arm64 import Arm64Error, install_site, pi_cpuinfo, possible_cpus


def test_possible_cpus_reads_ranges_and_single_ids() -> None:
    assert possible_cpus("0-1\n") == [0, 1]
    assert possible_cpus("0-3,6") == [0, 1, 2, 3, 6]
    assert possible_cpus("0") == [0]
    assert possible_cpus()  # this machine's


def test_pi_cpuinfo_lists_every_cpu_as_a_cortex_a72() -> None:
    text = pi_cpuinfo([0, 1, 3])
    assert [line.split(":")[1].strip() for line in text.splitlines()
            if line.startswith("processor")] == ["0", "1", "3"]
    assert text.count("CPU part\t: 0xd08") == 3 and text.count("CPU implementer\t: 0x41") == 3
    assert "Raspberry Pi 4" in text and "atomics" not in text  # ARMv8.0-A: no LSE


def test_pi_cpuinfo_of_a_pi_5_is_a_cortex_a76_with_atomics() -> None:
    text = pi_cpuinfo([0, 1], "cortex-a76")
    assert text.count("CPU part\t: 0xd0b") == 2 and text.count(" atomics ") == 2
    assert "Raspberry Pi 5" in text and "BCM2712" in text


def _fake_env(calls: list[tuple[str, ...]], failing: str | None = None
              ) -> Callable[..., subprocess.CompletedProcess[str]]:
    def arm64_env(*args: str, timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        code = 1 if args[0] == failing else 0
        return subprocess.CompletedProcess(list(args), code, "Successfully installed edgegrove-0.1.0\n",
                                           f"arm64-env: {args[0]} failed\n" if code else "")
    return arm64_env


def test_install_site_adds_torch_only_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(arm64, "arm64_env", _fake_env(calls))
    site = install_site(tmp_path, data=False, torch=True)
    assert calls == [("install", str(tmp_path)), ("torch", str(tmp_path))]
    assert site.path == tmp_path and site.pip_line == "Successfully installed edgegrove-0.1.0"
    calls.clear()
    install_site(tmp_path)
    assert calls == [("install", str(tmp_path)), ("data", str(tmp_path))]


def test_a_failed_torch_install_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(arm64, "arm64_env", _fake_env([], failing="torch"))
    with pytest.raises(Arm64Error, match="could not add torch") as failed:
        install_site(tmp_path, data=False, torch=True)
    assert "arm64-env: torch failed" in str(failed.value)
