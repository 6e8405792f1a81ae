"""The fleet as the retained topics tell it, and the short forms the commands print."""

from __future__ import annotations

from agent.jobs.document import DeviceRecord, ExecStatus, canonical_json
from agent.jobs.states import ExecState
from agent.operator.fleet import FleetView
from agent.operator.tables import ago, last_round, states_summary, table
from agent.transport.base import Message


def exec_status(device: str, state: ExecState, round_: int | None = None, accuracy: float | None = None,
                at: float = 1.0) -> Message:
    status = ExecStatus(job="j", device=device, state=state, round=round_, accuracy=accuracy, updated_at=at, seq=1)
    return Message(f"edgegrove/jobs/j/exec/{device}", canonical_json(status).encode(), True)


def test_records_states_and_chunks_are_filed_and_an_empty_payload_clears_them() -> None:
    record = DeviceRecord(id="pi-a", labels={"site": "barn"})
    view = FleetView().take_all([
        Message("edgegrove/devices/pi-a", canonical_json(record).encode(), True),
        Message("edgegrove/devices/pi-b", b"{not json", True),
        exec_status("pi-a", ExecState.TRAINING, 3, 0.5),
        Message("edgegrove/jobs/j/result/0", b"abc", True),
        Message("edgegrove/jobs/j/control", b"signed", True),
        Message("edgegrove/devices/pi-a/log", b"a log line is no record", False),
    ])
    assert view.devices == {"pi-a": record}
    assert view.unreadable == ["edgegrove/devices/pi-b"]
    assert view.execs["j"]["pi-a"].round == 3
    assert view.result_chunks == {"j": {0: b"abc"}} and view.stopped == {"j"}
    view.take(Message("edgegrove/devices/pi-a", b"", True))
    view.take(Message("edgegrove/jobs/j/control", b"", True))
    assert view.devices == {} and view.stopped == set()


def test_the_summary_counts_states_and_the_last_round_is_the_furthest() -> None:
    view = FleetView().take_all([exec_status("a", ExecState.TRAINING, 7, 0.8, at=5.0),
                                 exec_status("b", ExecState.TRAINING, 9, None, at=6.0),
                                 exec_status("c", ExecState.REJECTED)])
    execs = view.execs["j"]
    assert states_summary(None, execs) == "rejected 1, training 2"
    assert last_round(execs) == (9, 0.8)


def test_tables_align_and_times_read_as_ago() -> None:
    assert table(["A", "BB"], [["xyz", "1"]]) == "A    BB\nxyz  1"
    assert (ago(0, 10), ago(95, 100), ago(0.5, 600.5), ago(1, 7201)) == ("-", "5s ago", "10m ago", "2h ago")
