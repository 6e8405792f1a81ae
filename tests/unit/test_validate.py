"""The shared checks behind every command's usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.validate import (
    UsageError,
    bind_address,
    broker_url,
    one_line,
    output_dir,
    output_file,
    port,
    positive_seconds,
    whole,
)


@pytest.mark.parametrize("url", ["mqtt://127.0.0.1:1883", "mqtts://broker.local", "mqtt://[::1]:1884",
                                 "mqtt://h:65535"])
def test_good_broker_urls_pass(url: str) -> None:
    assert broker_url(url) == url


@pytest.mark.parametrize("url", ["http://h:1883", "not a url", "mqtt://h:99999", "mqtt://h:0",
                                 "mqtt://", "mqtt://user:pw@h:1883", "mqtt://h:1883/x", "h:1883", ""])
def test_bad_broker_urls_say_what_to_write(url: str) -> None:
    with pytest.raises(UsageError, match="mqtt://"):
        broker_url(url)


def test_numbers() -> None:
    assert port("0") == 0 and port("65535") == 65535
    assert whole(1, 5)("5") == 5
    for bad in ("6", "0", "x", "1.5"):
        with pytest.raises(UsageError, match=r"1\.\.5"):
            whole(1, 5)(bad)
    assert positive_seconds("0.5") == 0.5
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(UsageError):
            positive_seconds(bad)


def test_bind_addresses() -> None:
    assert bind_address("0.0.0.0") == "0.0.0.0" and bind_address("::") == "::"
    assert bind_address("broker.local") == "broker.local"
    with pytest.raises(UsageError):
        bind_address("not an address")


def test_output_paths_are_probed_without_leaving_anything(tmp_path: Path) -> None:
    assert output_dir(tmp_path) == tmp_path
    assert output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert output_file(tmp_path / "x" / "doc.json") == tmp_path / "x" / "doc.json"
    assert list(tmp_path.iterdir()) == []  # checking created nothing
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        output_dir(tmp_path / "f")
    with pytest.raises(UsageError, match="is a file"):
        output_file(tmp_path / "f" / "doc.json")
    with pytest.raises(UsageError, match="is a directory"):
        output_file(tmp_path)
    with pytest.raises(UsageError, match="cannot be written"):
        output_dir("/proc/edgegrove-test/run")


def test_one_line() -> None:
    assert one_line("[agent] is not valid:\n  algorithm: bad\n  lr: bad") == \
        "[agent] is not valid: algorithm: bad; lr: bad"
    assert one_line("plain") == "plain"
