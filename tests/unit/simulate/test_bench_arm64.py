"""The Raspberry Pi /proc/cpuinfo that LiteRT's CPU detection reads under qemu: one processor
block per CPU id the host's /sys lists (cpuinfo reads those from the host)."""

from __future__ import annotations

from simulate.bench.arm64 import pi_cpuinfo, possible_cpus


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
    assert "Raspberry Pi 4" in text
