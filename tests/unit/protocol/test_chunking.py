"""The fleet's chunk size: the downlink's rate from large messages' arrival, and the choice."""

from __future__ import annotations

import pytest

from agent.protocol.chunking import (
    DOWNLINK_SAMPLE_BYTES,
    DOWNLINK_SAMPLES,
    FAST_DOWNLINK_RATE,
    SLOW_DOWNLINK_RATE,
    SLOW_LINK_BROADCAST,
    SLOW_LINK_CHUNK_VALUES,
    DownlinkRate,
    broadcast_for,
    chunk_values_for,
)

MB = 1_000_000
CONFIGURED = 262_144


def rate_of(*samples: tuple[int, float]) -> float | None:
    rate = DownlinkRate()
    for nbytes, seconds in samples:
        rate.observe(nbytes, seconds)
    return rate.rate()


def test_no_rate_until_half_the_window_of_large_messages() -> None:
    assert rate_of(*[(MB, 0.2)] * (DOWNLINK_SAMPLES // 2 - 1)) is None
    assert rate_of(*[(DOWNLINK_SAMPLE_BYTES - 1, 1.0)] * DOWNLINK_SAMPLES) is None  # too small to time
    assert rate_of(*[(MB, 0.2)] * (DOWNLINK_SAMPLES // 2)) == pytest.approx(5 * MB)


def test_messages_read_at_once_do_not_hide_a_slow_link_but_a_fast_one_shows() -> None:
    """A message that waited whole in the socket while we were busy reads as instant: half
    the samples of a loaded 6 MB/s agent were. The lower quartile still sees the link."""
    slow_with_busy = [(MB, 1 / 6), (MB, 0.0)] * (DOWNLINK_SAMPLES // 2)
    assert rate_of(*slow_with_busy) == pytest.approx(6 * MB)
    fast_with_one_hiccup = [(MB, 0.0002)] * (DOWNLINK_SAMPLES - 1) + [(MB, 0.05)]
    measured = rate_of(*fast_with_one_hiccup)
    assert measured is not None and measured > FAST_DOWNLINK_RATE
    assert rate_of(*[(MB, 0.0)] * DOWNLINK_SAMPLES) == float("inf")  # untimed counts as fast


def test_only_the_latest_samples_count() -> None:
    rate = DownlinkRate()
    for _ in range(DOWNLINK_SAMPLES):
        rate.observe(MB, 0.5)
    for _ in range(DOWNLINK_SAMPLES):
        rate.observe(MB, 0.0)
    assert rate.rate() == float("inf")  # the link got fast again


def test_small_chunks_are_not_timed_so_a_fleet_on_them_keeps_them() -> None:
    """A chunk that queued behind another is partly in the socket before its clock starts: at
    50 MB/s the coordinator read its 128 KB float32 chunks (32,768 values) at 0.1-16 GB/s and
    the fleet went back to large chunks every few rounds. Only chunks of the configured size
    (256 KB and more, even in int8) and state transfers are timed."""
    rate = DownlinkRate()
    for _ in range(DOWNLINK_SAMPLES):
        rate.observe(MB, 1 / 50)  # large chunks at 50 MB/s
    for _ in range(5 * DOWNLINK_SAMPLES):
        rate.observe(131_121, 1e-5)  # a small float32 chunk, read at once
    assert rate.rate() == pytest.approx(50 * MB)
    assert chunk_values_for(rate.rate(), SLOW_LINK_CHUNK_VALUES, CONFIGURED) == SLOW_LINK_CHUNK_VALUES
    int8_chunk = CONFIGURED + 49  # 262,144 values of one byte and the frame's header
    assert int8_chunk >= DOWNLINK_SAMPLE_BYTES
    for _ in range(DOWNLINK_SAMPLES):
        rate.observe(int8_chunk, int8_chunk / 5e9)  # the link got fast: large chunks show it
    assert chunk_values_for(rate.rate(), SLOW_LINK_CHUNK_VALUES, CONFIGURED) == 0


@pytest.mark.parametrize(("rate", "current", "chosen"), [
    (6 * MB, 0, SLOW_LINK_CHUNK_VALUES),            # Wi-Fi-like: smaller chunks
    (SLOW_DOWNLINK_RATE * 0.99, 0, SLOW_LINK_CHUNK_VALUES),
    (SLOW_DOWNLINK_RATE * 1.01, 0, 0),               # fast enough: as configured
    (200 * MB, SLOW_LINK_CHUNK_VALUES, SLOW_LINK_CHUNK_VALUES),  # between: no flapping
    (200 * MB, 0, 0),
    (FAST_DOWNLINK_RATE * 1.01, SLOW_LINK_CHUNK_VALUES, 0),      # back to large chunks
    (None, SLOW_LINK_CHUNK_VALUES, SLOW_LINK_CHUNK_VALUES),      # nothing known: unchanged
    (None, 0, 0),
])
def test_the_chunk_size_follows_the_downlink_with_hysteresis(rate: float | None, current: int, chosen: int) -> None:
    assert chunk_values_for(rate, current, CONFIGURED) == chosen


def test_a_configured_size_at_or_below_the_slow_links_is_kept() -> None:
    assert chunk_values_for(1 * MB, 0, SLOW_LINK_CHUNK_VALUES) == 0
    assert chunk_values_for(1 * MB, 0, 16_384) == 0


@pytest.mark.parametrize(("rate", "current", "chosen"), [
    (6 * MB, "", SLOW_LINK_BROADCAST),                    # Wi-Fi-like: the fan-out
    (SLOW_DOWNLINK_RATE * 1.01, "", ""),                  # fast enough: as configured
    (200 * MB, SLOW_LINK_BROADCAST, SLOW_LINK_BROADCAST),  # between: no flapping
    (FAST_DOWNLINK_RATE * 1.01, SLOW_LINK_BROADCAST, ""),  # back to the configured one
    (None, SLOW_LINK_BROADCAST, SLOW_LINK_BROADCAST),      # nothing known: unchanged
    (None, "", ""),
])
def test_the_broadcast_follows_the_downlink_with_the_same_hysteresis(rate: float | None, current: str,
                                                                     chosen: str) -> None:
    assert broadcast_for(rate, current) == chosen


def test_a_view_over_several_sites_goes_by_the_uplinks_rate_whatever_the_downlink_says() -> None:
    from agent.protocol.chunking import ASSUMED_UPLINK_RATE, rate_across_sites

    assert rate_across_sites(None, ["s0", "s0", "s1"]) == ASSUMED_UPLINK_RATE
    assert rate_across_sites(5e9, ["s0", "s1"]) == ASSUMED_UPLINK_RATE
    assert rate_across_sites(2 * MB, ["s0", "s1"]) == 2 * MB  # a slower downlink still counts
    assert rate_across_sites(5e9, ["s0", "s0"]) == 5e9  # one site: its own downlink
    assert rate_across_sites(None, []) is None
    assert chunk_values_for(rate_across_sites(None, ["s0", "s1"]), 0, CONFIGURED) == SLOW_LINK_CHUNK_VALUES
