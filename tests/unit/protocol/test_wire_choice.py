"""wire_dtype "auto": the format a link fits, from its typical rate and the round's budget."""

from __future__ import annotations

import pytest

from agent.protocol.rto import RATE_SAMPLES_KEPT, LinkEstimators
from agent.protocol.wire import DType
from agent.protocol.wire_choice import AUTO_WIRE_BUDGET, choose, choose_for_own_link, narrowest

MODEL = 407_050  # the thesis model: 1.63 MB in float32
MB = 1e6


def test_an_unmeasured_link_gets_the_widest_format() -> None:
    assert choose(MODEL, None, AUTO_WIRE_BUDGET) == DType.F32
    assert choose(MODEL, 0.0, AUTO_WIRE_BUDGET) == DType.F32
    assert choose(MODEL, None, AUTO_WIRE_BUDGET, widest=DType.F16) == DType.F16


@pytest.mark.parametrize(("rate_mb", "expected"), [
    (1000, DType.F32), (20, DType.F32), (16.5, DType.F32),  # loopback, even a CPU-starved one
    (16, DType.F16), (8.2, DType.F16),  # not int8 above ~8.1 MB/s
    (8.0, DType.I8), (6, DType.I8), (3, DType.I8), (0.5, DType.I8),  # limited links, shared
])
def test_the_widest_format_whose_time_fits_the_budget(rate_mb: float, expected: DType) -> None:
    assert choose(MODEL, rate_mb * MB, AUTO_WIRE_BUDGET) == expected


def test_a_small_model_stays_float32_on_a_slow_link_and_the_budget_moves_the_thresholds() -> None:
    assert choose(1000, 1 * MB, AUTO_WIRE_BUDGET) == DType.F32  # 4 kB take 4 ms
    assert choose(MODEL, 6 * MB, 0.3) == DType.F32  # 0.27 s fit a budget of 0.3 s
    assert choose(MODEL, 6 * MB, 0.2) == DType.F16
    assert choose(MODEL, 100 * MB, AUTO_WIRE_BUDGET, widest=DType.I8) == DType.I8  # never wider


@pytest.mark.parametrize(("rate_mb", "expected"), [
    (560, DType.F32), (164, DType.F32),  # loopback's arrival rate at a load of 10 on 2 cores
    (162, DType.F16), (82, DType.F16),   # gigabit Ethernet
    (81, DType.I8), (50, DType.I8), (6, DType.I8),
])
def test_our_own_link_fits_the_busiest_links_vectors_in_its_budget(rate_mb: float, expected: DType) -> None:
    assert choose_for_own_link(MODEL, rate_mb * MB) == expected


def test_an_unmeasured_own_link_and_the_widest_allowed() -> None:
    assert choose_for_own_link(MODEL, None) == DType.F32
    assert choose_for_own_link(MODEL, 1e9, widest=DType.F16) == DType.F16


def test_narrowest() -> None:
    assert narrowest(DType.F32, DType.I8) == DType.I8 == narrowest(DType.I8, DType.F16)
    assert narrowest(DType.F16, DType.F32) == DType.F16
    assert narrowest(DType.F32, DType.F32) == DType.F32


def test_the_typical_rate_is_the_median_of_the_last_drains_so_one_stall_does_not_narrow() -> None:
    links = LinkEstimators()
    assert links.typical_rate(1) is None
    for _ in range(RATE_SAMPLES_KEPT - 1):
        links.observe_drain(1, 1_000_000, 0.02)  # 50 MB/s: loopback
    links.observe_drain(1, 1_000_000, 0.5)  # a 0.5 s stall of the host: 2 MB/s
    typical = links.typical_rate(1)
    assert typical == pytest.approx(50 * MB)
    assert choose(MODEL, typical, AUTO_WIRE_BUDGET) == DType.F32
    # A link that is slow every time is believed once most of the samples kept say so.
    for _ in range(RATE_SAMPLES_KEPT // 2):
        links.observe_drain(1, 1_000_000, 0.5)
    assert links.typical_rate(1) == pytest.approx(2 * MB)
    assert len(links.peers[1].drains) == RATE_SAMPLES_KEPT
    links.observe_drain(1, 1_000, 0.5)  # a small unit measures the round trip: not a sample
    assert len(links.peers[1].drains) == RATE_SAMPLES_KEPT
    # The timers' samples (single ACKs) are another estimate: they do not move this one.
    links.observe_rate(1, 1_000_000, 0.01)
    assert links.typical_rate(1) == pytest.approx(2 * MB) and links.peers[1].rate == pytest.approx(100 * MB)
