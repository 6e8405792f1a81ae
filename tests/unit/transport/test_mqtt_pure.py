"""The pure parts of agent.transport.mqtt: URL parsing and the pacing token bucket."""

from __future__ import annotations

import pytest

from agent.transport.mqtt import TokenBucket, parse_broker_url


def test_parse_broker_url_accepts_mqtt_and_mqtts_with_default_ports() -> None:
    assert parse_broker_url("mqtt://127.0.0.1:1999").url == "mqtt://127.0.0.1:1999"
    plain = parse_broker_url("mqtt://broker.local")
    assert (plain.host, plain.port, plain.tls) == ("broker.local", 1883, False)
    tls = parse_broker_url("mqtts://broker.local")
    assert (tls.port, tls.tls) == (8883, True)


@pytest.mark.parametrize("url", ["http://h:1", "h:1883", "mqtt://", "mqtt://h:99999",
                                 "mqtt://u:p@h:1", "mqtt://h:1/x", "tcp://h:1883"])
def test_parse_broker_url_rejects_everything_else_saying_what_to_use(url: str) -> None:
    with pytest.raises(ValueError, match="mqtt://HOST:PORT"):
        parse_broker_url(url)


def test_token_bucket_lets_a_burst_through_then_paces_at_the_rate() -> None:
    bucket = TokenBucket(rate=1000.0, burst=500.0, now=0.0)
    assert bucket.reserve(500, now=0.0) == 0.0
    assert bucket.reserve(250, now=0.0) == pytest.approx(0.25)
    # after waiting those 0.25 s the debt is paid; the next 100 bytes cost 0.1 s
    assert bucket.reserve(100, now=0.25) == pytest.approx(0.1)
    # a long idle time refills only up to the burst
    assert bucket.reserve(500, now=100.0) == 0.0
    assert bucket.reserve(1000, now=100.0) == pytest.approx(1.0)


def test_token_bucket_rejects_non_positive_rates() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, burst=1.0, now=0.0)
