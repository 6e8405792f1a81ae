"""Per-peer link estimates: the RTO (RFC 6298) and the byte rate a unit's timeout covers."""

from __future__ import annotations

import pytest

from agent.protocol.rto import MIN_RATE_SAMPLE_BYTES, RATE_HEADROOM, LinkEstimators


def test_an_unmeasured_link_drains_at_the_floor_rate() -> None:
    links = LinkEstimators(rate_floor=2e6)
    assert links.transmit_time(1, 1_000_000) == pytest.approx(0.5)
    assert links.transmit_time(1, 0) == 0.0


def test_a_measured_rate_counts_below_the_floor_and_far_above_it_with_headroom() -> None:
    links = LinkEstimators(rate_floor=2e6)
    links.observe_rate(1, 1_000_000, 1.0)  # 1 MB/s: slower than the floor
    assert links.transmit_time(1, 1_000_000) == pytest.approx(1.0)
    links.observe_rate(2, 1_000_000, 0.1)  # 10 MB/s: it may be slow next round, the floor holds
    assert links.transmit_time(2, 1_000_000) == pytest.approx(0.5)
    # 100 MB/s (loopback, wired): a RATE_HEADROOM-th of it, not half a second per MB, which
    # every silence verdict on the link would wait (issue 12).
    links.observe_rate(3, 1_000_000, 0.01)
    assert links.transmit_time(3, 1_000_000) == pytest.approx(RATE_HEADROOM / 100.0)
    assert links.transmit_time(3, 1_000_000) < links.transmit_time(2, 1_000_000)


def test_a_slower_rate_sample_is_believed_at_once_a_faster_one_slowly() -> None:
    links = LinkEstimators(rate_floor=2e6)
    links.observe_rate(1, 1_000_000, 0.01)  # 100 MB/s
    links.observe_rate(1, 1_000_000, 1.0)  # the link dropped to 1 MB/s: next unit, no headroom
    assert links.peers[1].rate == pytest.approx(1e6)
    assert links.transmit_time(1, 1_000_000) == pytest.approx(1.0)
    links.observe_rate(1, 1_000_000, 0.01)  # fast again: up by RATE_ALPHA of the gap
    assert links.peers[1].rate == pytest.approx(0.75 * 1e6 + 0.25 * 1e8)


def test_rate_samples_are_smoothed_and_small_units_give_none() -> None:
    links = LinkEstimators(rate_floor=1e9)
    links.observe_rate(1, MIN_RATE_SAMPLE_BYTES - 1, 1e-3)
    assert links.transmit_time(1, 1_000_000) == pytest.approx(1e-3)  # still the floor
    links.observe_rate(1, 1_000_000, 1.0)
    links.observe_rate(1, 1_000_000, 0.5)
    assert links.peers[1].rate == pytest.approx(0.75 * 1e6 + 0.25 * 2e6)
    links.observe_rate(1, 1_000_000, 1.0)  # slower: at once
    assert links.peers[1].rate == pytest.approx(1e6)


def test_fixed_timeouts_add_no_transmission_time() -> None:
    links = LinkEstimators(fixed=0.5)
    assert links.transmit_time(1, 10_000_000) == 0.0
    assert links.rto(1) == 0.5


def test_the_round_peak_follows_a_longer_round_at_once_and_decays_slowly() -> None:
    links = LinkEstimators()
    links.observe_round(1.0)
    links.observe_round(2.0)
    assert links.round_peak == 2.0 and links.round_time == pytest.approx(1.2)
    links.observe_round(1.0)
    assert links.round_peak == pytest.approx(1.8)
