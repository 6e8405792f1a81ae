"""JSON messages: round trips, and a typed MessageError (only) for anything else."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.protocol.messages import (
    MAX_MESSAGE_BYTES,
    Control,
    MessageError,
    Status,
    Telemetry,
    View,
    _JsonMessage,
)

FP = "0123456789abcdef"  # every view names its model's fingerprint
EXAMPLES: list[_JsonMessage] = [
    Status(node=3, state="online", round=12, pid=4242, incarnation=2),
    Status(node=0, state="offline"),
    Status(node=2, state="online", round=3, pid=7, incarnation=1, fingerprint="0123456789abcdef",
           model="mnist-cnn", params=1234, labels=[5, 0, 17]),
    View(epoch=4, members=[0, 1, 2, 5], arity=2, coordinator=0, from_round=17, fingerprint=FP),
    View(epoch=5, members=[0, 1, 2, 5], arity=2, coordinator=0, from_round=19, chunk_values=32768, fingerprint=FP),
    View(epoch=7, members=[0, 1, 3], arity=2, coordinator=0, from_round=40, sync_every=12, fingerprint=FP),
    Status(node=5, state="online", round=30, step_s=0.0042, sync_s=0.95),
    View(epoch=6, members=[0, 2], arity=2, coordinator=0, from_round=20, fingerprint="fedcba9876543210",
         model="mlp", params=407050),
    Telemetry(node=2, round=9, epoch=1, algorithm="ft-tree", wall_time=1732870000.5, loss=0.31,
              accuracy=0.94, phase_seconds={"reduce": 0.02, "broadcast": 0.01}, bytes_sent=1628200,
              bytes_received=3256400, contributors=7, members=7, reroutes=1, timeouts=1,
              degraded=True, missing_chunks=2, rejected={"bad_crc": 1}, links={"0": "failed",
              "5": "rerouted"}, model_hash="0badf00d",
              events=[{"kind": "reroute", "peer": 0, "detail": "via 1"}], machine="aarch64"),
    Control(action="cut", node=1, peer=3, one_way=True),
    Control(action="loss", node=4, value=0.25),
]


def _fields(message: _JsonMessage) -> dict[str, Any]:
    return json.loads(message.encode())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(message: _JsonMessage) -> None:
    assert type(message).decode(message.encode()) == message


def test_telemetry_machine_is_optional_and_round_trips() -> None:
    old = b'{"node": 1, "round": 2, "epoch": 0, "algorithm": "ft-tree", "wall_time": 1.0}'
    assert Telemetry.decode(old).machine == ""  # an agent that does not say
    arm = Telemetry(node=1, round=2, epoch=0, algorithm="ft-tree", wall_time=1.0, machine="aarch64")
    assert _fields(arm)["machine"] == "aarch64"
    assert Telemetry.decode(arm.encode()) == arm


def test_a_views_chunk_size_is_optional_and_checked() -> None:
    old = b'{"epoch": 1, "members": [0, 1], "arity": 2, "coordinator": 0, "from_round": 3, "fingerprint": "0123456789abcdef"}'
    assert View.decode(old).chunk_values == 0  # the agents' configured chunk size
    for bad in (10, 1 << 21, True, "32768", -1):
        doc = json.loads(old)
        doc["chunk_values"] = bad
        with pytest.raises(MessageError) as caught:
            View.decode(json.dumps(doc).encode())
        assert caught.value.reason == "bad_field"


@settings(max_examples=100)
@given(st.integers(0, 1023), st.sampled_from(["online", "joining", "offline"]),
       st.integers(0, 2**53), st.integers(0, 2**31))
def test_status_round_trip_property(node: int, state: str, rnd: int, pid: int) -> None:
    status = Status(node=node, state=state, round=rnd, pid=pid)  # type: ignore[arg-type]
    assert Status.decode(status.encode()) == status


@settings(max_examples=100)
@given(st.sets(st.integers(0, 1023), min_size=1, max_size=64), st.integers(2, 16))
def test_view_round_trip_property(members: set[int], arity: int) -> None:
    view = View(epoch=1, members=sorted(members), arity=arity, coordinator=min(members), from_round=0,
                fingerprint=FP)
    assert View.decode(view.encode()) == view


@pytest.mark.parametrize("data", [
    b"", b"{", b"null", b"[]", b"42", b'"text"', b"\xff\xfe", b'{"node": 1,}',
    b"[" * 50_000 + b"]" * 50_000,  # deep nesting: json's recursion limit
    b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
])
@pytest.mark.parametrize("kind", [Status, View, Telemetry, Control])
def test_bad_json_is_a_message_error(kind: type[_JsonMessage], data: bytes) -> None:
    with pytest.raises(MessageError) as caught:
        kind.decode(data)
    assert caught.value.reason in ("bad_json", "bad_field")


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_unknown_fields_are_refused(message: _JsonMessage) -> None:
    fields = _fields(message) | {"surprise": 1}
    with pytest.raises(MessageError) as caught:
        type(message).decode(json.dumps(fields).encode())
    assert caught.value.reason == "unknown_field"


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_missing_required_fields_are_refused(message: _JsonMessage) -> None:
    fields = _fields(message)
    required = {"Status": "state", "View": "members", "Telemetry": "wall_time", "Control": "action"}
    del fields[required[type(message).__name__]]
    with pytest.raises(MessageError) as caught:
        type(message).decode(json.dumps(fields).encode())
    assert caught.value.reason == "bad_field"


WRONG: dict[str, list[tuple[str, Any]]] = {
    "Status": [("node", "3"), ("node", -1), ("node", 1024), ("node", True), ("node", 1.5),
               ("state", "dancing"), ("state", 1), ("round", -1), ("round", None),
               ("pid", "x"), ("pid", [1]), ("incarnation", False), ("fingerprint", "abc"),
               ("fingerprint", "0123456789ABCDEF"), ("fingerprint", 7), ("model", "x" * 65),
               ("model", None), ("params", -1), ("labels", {"0": 3}), ("labels", [1, -2]),
               ("labels", [0.5]), ("labels", [0] * 1025), ("step_s", -0.1), ("step_s", "fast"),
               ("sync_s", None), ("sync_s", True)],
    "View": [("epoch", "1"), ("members", "0,1"), ("members", [2, 1]), ("members", [1, 1]),
             ("members", [0, 5000]), ("members", [0, "1"]), ("arity", 1), ("arity", 17),
             ("coordinator", None), ("from_round", 2.5), ("fingerprint", "zz" * 8),
             ("model", 3), ("params", "many"), ("sync_every", -1), ("sync_every", 2.5),
             ("sync_every", "auto"), ("sync_every", 1_000_001)],
    "Telemetry": [("node", None), ("round", "9"), ("algorithm", 3), ("wall_time", "now"),
                  ("wall_time", True), ("loss", "low"), ("loss", [0.1]), ("accuracy", False),
                  ("phase_seconds", [1]), ("phase_seconds", {"reduce": "fast"}),
                  ("bytes_sent", -5), ("degraded", 1), ("rejected", {"bad_crc": "many"}),
                  ("rejected", []), ("links", {"1": "broken"}), ("links", []),
                  ("events", {"kind": "x"}), ("events", ["reroute"]), ("model_hash", 7),
                  ("machine", 64), ("machine", "x" * 65)],
    "Control": [("action", "explode"), ("action", None), ("node", -1), ("peer", "3"),
                ("value", "fast"), ("value", True), ("one_way", "yes")],
}


def _wrong_cases() -> list[tuple[_JsonMessage, str, Any]]:
    by_kind = {type(m).__name__: m for m in EXAMPLES}
    return [(by_kind[k], name, value) for k, cases in WRONG.items() for name, value in cases]


@pytest.mark.parametrize(("message", "name", "value"), _wrong_cases(),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_wrong_types_and_ranges_are_refused(message: _JsonMessage, name: str, value: Any) -> None:
    fields = _fields(message) | {name: value}
    with pytest.raises(MessageError) as caught:
        type(message).decode(json.dumps(fields).encode())
    assert caught.value.reason == "bad_field"
    assert str(caught.value)  # says what was wrong


@pytest.mark.parametrize("action", ["cut", "heal"])
def test_link_actions_need_a_peer(action: str) -> None:
    with pytest.raises(MessageError, match="peer"):
        Control.decode(json.dumps({"action": action, "node": 1}).encode())


def test_too_large_payloads_are_refused_before_parsing() -> None:
    big = Telemetry(node=1, round=1, epoch=1, algorithm="ft-tree", wall_time=0.0,
                    events=[{"detail": "x" * 1000}] * 300).encode()
    assert len(big) > MAX_MESSAGE_BYTES
    with pytest.raises(MessageError) as caught:
        Telemetry.decode(big)
    assert caught.value.reason == "too_large"
    with pytest.raises(MessageError) as caught:
        Status.decode(b" " * (MAX_MESSAGE_BYTES + 1))
    assert caught.value.reason == "too_large"


@settings(max_examples=500, deadline=None)
@given(st.one_of(
    st.binary(max_size=200),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                     st.sampled_from(["node", "state", "round", "members", "arity", "action",
                                      "links", "events", "value", "x"]), inner, max_size=6),
                 max_leaves=20).map(lambda obj: json.dumps(obj).encode()),
))
def test_anything_decodes_to_a_message_or_a_message_error(data: bytes) -> None:
    for kind in (Status, View, Telemetry, Control):
        try:
            message = kind.decode(data)
        except MessageError as exc:
            assert exc.reason in ("bad_json", "unknown_field", "bad_field", "too_large")
        else:
            assert kind.decode(message.encode()) == message


def test_telemetry_wire_frames_are_counts_by_format() -> None:
    tel = Telemetry(node=1, round=2, epoch=0, algorithm="ft-tree", wall_time=1.0, wire_frames={"int8": 3})
    assert Telemetry.decode(tel.encode()).wire_frames == {"int8": 3}
    assert Telemetry.decode(Telemetry(node=1, round=2, epoch=0, algorithm="ft-tree", wall_time=1.0).encode()).wire_frames == {}
    for bad in ({"int8": -1}, {"int8": "3"}, {f"f{i}": 1 for i in range(9)}):
        with pytest.raises(MessageError):
            Telemetry.decode(replace(tel, wire_frames=bad).encode())


def test_telemetry_says_when_the_rounds_allreduce_ended_or_nothing() -> None:
    tel = Telemetry(node=1, round=2, epoch=0, algorithm="ft-tree", wall_time=5.0, reduced_at=4.95)
    assert Telemetry.decode(tel.encode()).reduced_at == 4.95
    assert Telemetry.decode(replace(tel, reduced_at=0.0).encode()).reduced_at == 0.0  # not said
    with pytest.raises(MessageError):
        Telemetry.decode(replace(tel, reduced_at="soon").encode())  # type: ignore[arg-type]


def test_a_view_says_how_its_rounds_broadcast_and_an_old_one_says_nothing() -> None:
    view = View(epoch=3, members=[0, 1, 2], arity=2, coordinator=0, from_round=9, broadcast="fanout",
                fingerprint=FP)
    assert View.decode(view.encode()) == view
    old = json.loads(view.encode())
    del old["broadcast"]
    assert View.decode(json.dumps(old).encode()).broadcast == ""  # the configured one
    for bad in ("multicast", 1, None):
        with pytest.raises(MessageError):
            View.decode(replace(view, broadcast=bad).encode())  # type: ignore[arg-type]


def test_a_status_says_its_model_and_labels_and_an_old_one_says_nothing() -> None:
    old = b'{"node": 4, "state": "online", "round": 0, "pid": 1, "incarnation": 2}'
    status = Status.decode(old)
    assert (status.fingerprint, status.model, status.params, status.labels) == ("", "", 0, [])
    new = Status(node=4, state="online", fingerprint="00ff00ff00ff00ff", model="digits-mlp",
                 params=2410, labels=[180, 182])
    assert _fields(new)["fingerprint"] == "00ff00ff00ff00ff"
    assert _fields(new)["labels"] == [180, 182]
    assert Status.decode(new.encode()) == new


def test_a_view_names_the_fleets_model_and_one_that_does_not_is_refused() -> None:
    old = b'{"epoch": 1, "members": [0, 1], "arity": 2, "coordinator": 0, "from_round": 3}'
    with pytest.raises(MessageError, match="fingerprint"):  # it would pass every model check
        View.decode(old)
    view = View(epoch=1, members=[0, 1], arity=2, coordinator=0, from_round=3,
                fingerprint="1111222233334444", model="mnist-cnn", params=1234)
    assert View.decode(view.encode()) == view


def test_a_view_says_its_local_steps_and_a_status_its_timing_and_old_ones_say_nothing() -> None:
    old_view = b'{"epoch": 1, "members": [0, 1], "arity": 2, "coordinator": 0, "from_round": 3, "fingerprint": "0123456789abcdef"}'
    assert View.decode(old_view).sync_every == 0  # as the agents are configured
    view = View(epoch=2, members=[0, 1], arity=2, coordinator=0, from_round=9, sync_every=24, fingerprint=FP)
    assert _fields(view)["sync_every"] == 24 and View.decode(view.encode()) == view
    old_status = b'{"node": 4, "state": "online", "round": 0, "pid": 1, "incarnation": 2}'
    assert (Status.decode(old_status).step_s, Status.decode(old_status).sync_s) == (0.0, 0.0)
    status = Status(node=4, state="online", round=8, step_s=0.003, sync_s=0.41)
    assert Status.decode(status.encode()) == status
    with pytest.raises(MessageError):
        Status.decode(json.dumps(_fields(status) | {"sync_s": float("inf")}).encode())
