"""The agent's process usage (agent/usage.py): CPU share between samples, resident memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.protocol.messages import MessageError, Telemetry
from agent.usage import ProcessUsage, resident_bytes


def test_cpu_share_covers_the_time_since_the_previous_sample() -> None:
    cpu, wall = [10.0], [100.0]
    usage = ProcessUsage(cpu=lambda: cpu[0], wall=lambda: wall[0], rss=lambda: 4096)
    cpu[0], wall[0] = 10.5, 102.0  # half a core-second over two seconds
    first = usage.sample()
    assert first.cpu_percent == pytest.approx(25.0) and first.rss_bytes == 4096
    cpu[0], wall[0] = 12.5, 103.0  # two threads busy for a second
    assert usage.sample().cpu_percent == pytest.approx(200.0)
    assert usage.sample().cpu_percent is None  # no time passed: no share to say


def test_resident_bytes_reads_statm_pages(tmp_path: Path) -> None:
    import os

    statm = tmp_path / "statm"
    statm.write_text("5000 1234 300 10 0 900 0\n")
    assert resident_bytes(str(statm)) == 1234 * os.sysconf("SC_PAGE_SIZE")
    assert resident_bytes() > 1_000_000  # this process, for real
    assert resident_bytes(str(tmp_path / "absent")) > 0  # getrusage's peak instead


def test_telemetry_carries_and_checks_the_usage() -> None:
    base = {"node": 1, "round": 2, "epoch": 1, "algorithm": "ft-tree", "wall_time": 1.0}
    tel = Telemetry(**base, cpu_percent=87.5, rss_bytes=50_000_000)
    assert Telemetry.decode(tel.encode()) == tel
    assert Telemetry.decode(Telemetry(**base).encode()).cpu_percent is None  # not said
    for bad in ({"cpu_percent": -1.0}, {"rss_bytes": -5}, {"cpu_percent": "x"}):
        with pytest.raises(MessageError):
            Telemetry.decode(Telemetry(**base, **bad).encode())  # type: ignore[arg-type]
