"""Node assignment from the retained device records."""

from __future__ import annotations

import pytest

from agent.jobs.document import DataSourceInfo, DeviceRecord, Selector
from agent.jobs.states import DeviceState
from agent.operator.assign import AssignError, assign


def record(device: str, data: tuple[str, ...] = ("mnist",), site: str = "barn",
           state: DeviceState = DeviceState.IDLE, error: str = "") -> DeviceRecord:
    return DeviceRecord(id=device, labels={"site": site}, state=state,
                        data={name: DataSourceInfo(format="mnist", samples=10, error=error) for name in data})


def fleet(*records: DeviceRecord) -> dict[str, DeviceRecord]:
    return {r.id: r for r in records}


def test_matching_devices_sorted_by_id_get_node_ids_from_zero() -> None:
    devices = fleet(record("pi-c"), record("pi-a"), record("pi-b", site="hall"), record("pi-d"))
    chosen = assign(devices, Selector(labels={"site": "barn"}), "mnist", 2)
    assert chosen.nodes == {"pi-a": 0, "pi-c": 1, "pi-d": 2}
    assert chosen.skipped == {}


def test_all_and_a_list_select_as_written() -> None:
    devices = fleet(record("a"), record("b"), record("c"))
    assert assign(devices, Selector(), "mnist", 1).nodes == {"a": 0, "b": 1, "c": 2}
    assert assign(devices, Selector(devices=["c", "a"]), "mnist", 1).nodes == {"a": 0, "c": 1}


def test_a_device_without_the_data_source_or_offline_is_skipped_with_the_reason() -> None:
    devices = fleet(record("a"), record("b", data=("cameras",)), record("c", state=DeviceState.OFFLINE),
                    record("d", error="no such folder"), record("e"))
    chosen = assign(devices, Selector(), "mnist", 2)
    assert chosen.nodes == {"a": 0, "e": 1}
    assert chosen.skipped == {"b": "no data source mnist", "c": "offline",
                              "d": "data source mnist cannot be read (no such folder)"}


def test_fewer_devices_than_the_minimum_is_refused_saying_why() -> None:
    devices = fleet(record("a"), record("b", data=()), record("c", state=DeviceState.OFFLINE))
    with pytest.raises(AssignError, match=r"1 device can take the job, fewer than min_devices 2 .*b: no data"):
        assign(devices, Selector(), "mnist", 2)


def test_no_matching_device_holding_the_data_source_is_refused() -> None:
    with pytest.raises(AssignError, match="holds a data source 'digits'"):
        assign(fleet(record("a"), record("b")), Selector(), "digits", 1)


def test_an_unknown_device_in_the_list_or_no_match_is_refused() -> None:
    with pytest.raises(AssignError, match="no enrolled device zz"):
        assign(fleet(record("a")), Selector(devices=["a", "zz"]), "mnist", 1)
    with pytest.raises(AssignError, match="labels site=shop"):
        assign(fleet(record("a")), Selector(labels={"site": "shop"}), "mnist", 1)
