"""agent/transport/reconnect_pace.py: how long each reconnect attempt waits."""

from __future__ import annotations

import pytest

from agent.transport.reconnect_pace import FULL_EVERY, UNANSWERED_TIMEOUT_S, ReconnectPace


def test_after_an_unanswered_attempt_the_next_ones_are_short_with_a_full_one_now_and_then() -> None:
    pace = ReconnectPace(2.0)
    assert pace.timeout() == 2.0  # the first attempt after a drop: the full wait
    timeouts = []
    for _ in range(2 * FULL_EVERY):
        pace.timed_out()
        timeouts.append(pace.timeout())
    assert timeouts.count(2.0) == 2 and timeouts[FULL_EVERY - 1] == 2.0
    assert all(t == UNANSWERED_TIMEOUT_S for i, t in enumerate(timeouts) if (i + 1) % FULL_EVERY)
    # A cut of 10 s: a SYN goes out several times a second, not once (2 s attempts).
    assert sum(timeouts) / len(timeouts) < 0.5


def test_a_slow_network_gets_a_few_times_its_last_handshake_and_never_more_than_the_full_wait() -> None:
    pace = ReconnectPace(2.0)
    pace.answered(0.2)  # e.g. LTE
    pace.timed_out()
    assert pace.timeout() == pytest.approx(0.8)
    pace.answered(1.5)
    pace.timed_out()
    assert pace.timeout() == 2.0


def test_an_answer_or_a_refusal_ends_the_short_attempts() -> None:
    pace = ReconnectPace(2.0)
    pace.timed_out()
    assert pace.timeout() == UNANSWERED_TIMEOUT_S
    pace.refused()  # a broker that is down refuses: the caller's backoff, the full wait
    assert pace.timeout() == 2.0
    pace.timed_out()
    pace.answered(0.01)
    assert pace.timeout() == 2.0
