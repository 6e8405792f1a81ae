"""broker-config/make-sites: the site plan and what each bridge carries (no broker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulate.site_brokers import _load_make_sites


def test_split_sites_makes_contiguous_blocks_of_nearly_equal_size() -> None:
    ms = _load_make_sites()
    assert ms.split_sites(range(7), 3) == {"s0": [0, 1, 2], "s1": [3, 4], "s2": [5, 6]}
    with pytest.raises(ValueError, match="--sites"):
        ms.split_sites(range(2), 3)


def test_a_bridge_carries_only_link_frames_that_cross_sites() -> None:
    ms = _load_make_sites()
    lines = ms.bridge_topics("edgegrove/j", [0, 1, 2], range(6), ["s1"])
    links = [line for line in lines if "/link/" in line]
    assert sorted(links) == sorted(
        [f"topic edgegrove/j/link/+/{j} out 0" for j in (3, 4, 5)]
        + [f"topic edgegrove/j/link/+/{j} in 0" for j in (0, 1, 2)])
    for kind in ("status", "view", "suspect", "state"):  # never both ways: no stale echo
        assert f"topic edgegrove/j/{kind}/0 out 1" in lines and f"topic edgegrove/j/{kind}/3 in 1" in lines
        assert f"topic edgegrove/j/{kind}/3 out 1" not in lines
    assert not [line for line in lines if " both " in line]
    assert "topic edgegrove/j/telemetry/2 out 0" in lines and "topic edgegrove/j/control in 1" in lines
    assert "topic edgegrove/j/bridge/s1 in 1" in lines


def test_make_sites_writes_core_and_site_configs_with_bridge_users(tmp_path: Path) -> None:
    ms = _load_make_sites()
    doc = ms.make_sites(tmp_path, range(4), 2, "j", core_port=2000, site_ports={"s0": 2001, "s1": 2002})
    assert doc["sites"] == {"s0": {"ids": [0, 1], "port": 2001}, "s1": {"ids": [2, 3], "port": 2002}}
    assert json.loads((tmp_path / "credentials.json").read_text())["bridges"]["s1"]["username"] == "bridge-s1"
    core_acl = (tmp_path / "core" / "acl").read_text()
    assert "user bridge-s0\ntopic readwrite edgegrove/j/#" in core_acl
    conf = (tmp_path / "site-s1" / "mosquitto.conf").read_text()
    assert "listener 2002 127.0.0.1" in conf and "address 127.0.0.1:2000" in conf
    assert "remote_username bridge-s1" in conf and "topic edgegrove/j/link/+/0 out 0" in conf
    assert "\nconnection " not in (tmp_path / "core" / "mosquitto.conf").read_text()
