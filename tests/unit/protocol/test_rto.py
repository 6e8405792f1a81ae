"""Per-peer link estimates: the RTO (RFC 6298) and the byte rate a unit's timeout covers."""

from __future__ import annotations

import pytest

from agent.protocol.rto import (
    INBOUND_SAMPLES_TRUSTED,
    MIN_RATE_SAMPLE_BYTES,
    RATE_HEADROOM,
    RATE_SAMPLES_KEPT,
    LinkEstimators,
)


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


def test_a_peers_bytes_arrive_at_the_floor_for_every_sharer_until_its_pace_is_trusted() -> None:
    links = LinkEstimators(rate_floor=2e6)
    # Never seen: 1 MB from it, with one sibling's 1 MB arriving too, at the floor.
    assert links.arrival_time(1, 1_000_000, sharing=2) == pytest.approx(1.0)
    for _ in range(INBOUND_SAMPLES_TRUSTED - 1):
        links.observe_inbound(1, 1_000_000, 0.001)  # 1 GB/s: not yet believed
    assert links.arrival_time(1, 1_000_000, sharing=2) == pytest.approx(1.0)
    links.observe_inbound(1, 1_000_000, 0.001)
    # Trusted: its frames' pace already shows what the sharers took of the path.
    assert links.arrival_time(1, 1_000_000, sharing=2) == pytest.approx(RATE_HEADROOM / 1000.0)


def test_a_slow_uplinks_pace_holds_however_fast_our_own_link_is() -> None:
    """A leaf on 2 MB/s among fast links: its units take 0.5 s a MB to reach us, whatever
    our downlink shows (counting them at its rate took it for silent every round)."""
    links = LinkEstimators(rate_floor=2e6)
    for _ in range(RATE_SAMPLES_KEPT):
        links.observe_inbound(3, 1_000_000, 0.5)
    assert links.arrival_time(3, 1_000_000, sharing=2) == pytest.approx(0.5)


def test_the_lower_quartile_of_a_peers_pace_outvotes_frames_read_together_after_a_stall() -> None:
    links = LinkEstimators(rate_floor=2e6)
    for seconds in (0.05, 0.05, 0.0001, 0.0001, 0.05):  # 20 MB/s; two read at once (10 GB/s)
        links.observe_inbound(2, 1_000_000, seconds)
    assert links.arrival_time(2, 1_000_000) == pytest.approx(RATE_HEADROOM / 20.0)  # 20 MB/s
    links.observe_inbound(2, 1_000_000, 0.0)  # both in one read: no time to divide by
    links.observe_inbound(2, 1_000, 0.0001)  # too small to show a rate
    assert links.arrival_time(2, 1_000_000) == pytest.approx(RATE_HEADROOM / 20.0)


def test_fixed_timeouts_count_no_arrival_time() -> None:
    links = LinkEstimators(fixed=0.2)
    assert links.arrival_time(1, 1_000_000, sharing=3) == 0.0


def test_without_headroom_a_trusted_pace_counts_as_measured_and_an_unknown_one_at_the_floor() -> None:
    links = LinkEstimators(rate_floor=2e6)
    assert links.arrival_time(1, 1_000_000, sharing=2, headroom=False) == pytest.approx(1.0)
    for _ in range(INBOUND_SAMPLES_TRUSTED):
        links.observe_inbound(1, 1_000_000, 0.04)  # 25 MB/s
    assert links.arrival_time(1, 1_000_000, headroom=False) == pytest.approx(0.04)
    assert links.arrival_time(1, 1_000_000) == pytest.approx(RATE_HEADROOM * 0.04)
