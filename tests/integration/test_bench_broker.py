"""bench broker end to end: real mosquitto (from broker-config/) and the embedded broker,
plain paho clients in their own processes, a tiny payload and few repeats. Figures are
printed, not asserted: the test checks that every message was counted and the JSON is whole."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from simulate.bench import broker
from simulate.brokers import mosquitto_available

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    broker.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_tiny_payload_on_both_brokers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not mosquitto_available():
        pytest.fail("mosquitto is not installed: run scripts/setup.sh --dev")
    out = tmp_path / "broker.json"
    code = broker.run(_args("--sizes", "2048", "--subscribers", "1", "2", "--repeats", "2",
                            "--warmup", "1", "--megabytes", "0.2", "--embedded-megabytes", "0.05",
                            "--json", "--out", str(out)))
    captured = capsys.readouterr()
    print(captured.err)
    assert code == 0, captured.err
    doc = json.loads(captured.out)
    assert json.loads(out.read_text()) == doc
    assert doc["benchmark"] == "broker" and doc["machine"]["mosquitto"]
    cases = {(r["broker"], r["subscribers"]): r for r in doc["results"]}
    assert set(cases) == {("mosquitto", 1), ("mosquitto", 2), ("embedded", 1), ("embedded", 2)}
    for (name, subscribers), r in cases.items():
        assert "error" not in r, r
        assert r["messages"] == (98 if name == "mosquitto" else 25)
        assert r["lost"] == 0  # a few KB on loopback: nothing may go missing
        assert r["broker_mb_s"]["n"] == 2 and r["broker_mb_s"]["median"] > 0
        # in+out counts each message once in and once per subscriber out
        assert r["broker_mb_s"]["median"] > r["delivered_mb_s"]["median"] * (subscribers + 1) / subscribers * 0.99
    assert [t["nodes"] for t in doc["bound"]["trees"]] == [7, 15, 31, 63]
    assert all(t["bound_ms"] > 0 for t in doc["bound"]["trees"])
    print(broker.render_table(doc))


def test_a_broker_that_cannot_start_is_reported_per_case(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EDGEGROVE_BROKER_CONFIG", str(tmp_path / "nowhere"))
    code = broker.run(_args("--brokers", "mosquitto", "--sizes", "2048", "--repeats", "1",
                            "--megabytes", "0.01", "--json"))
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert len(doc["results"]) == 2 and all("EDGEGROVE_BROKER_CONFIG" in r["error"] for r in doc["results"])
    assert "bound" not in doc
