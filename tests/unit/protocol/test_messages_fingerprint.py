"""A view must name the fleet's model: one without a fingerprint is refused at decoding (a
hijacked fleet once took such a view, which passes every agent's model check)."""

from __future__ import annotations

import json

import pytest

from agent.protocol.messages import MessageError, Status, View

FINGERPRINT = "0123456789abcdef"


def _view(**fields: object) -> View:
    base = dict(epoch=3, members=[0, 1, 2], arity=2, coordinator=0, from_round=5,
                fingerprint=FINGERPRINT, model="mlp", params=407050)
    return View(**{**base, **fields})  # type: ignore[arg-type]


def test_a_view_with_a_fingerprint_round_trips() -> None:
    view = _view()
    assert View.decode(view.encode()) == view


@pytest.mark.parametrize("payload", [
    {"fingerprint": ""},
    {},  # no fingerprint field at all: the default, empty
])
def test_a_view_without_a_fingerprint_is_refused(payload: dict[str, object]) -> None:
    fields = json.loads(_view().encode())
    fields.pop("fingerprint")
    fields.update(payload)
    with pytest.raises(MessageError, match="fingerprint"):
        View.decode(json.dumps(fields).encode())


def test_a_status_may_still_leave_its_fingerprint_out() -> None:
    """A Last Will (and an agent that does not know its model) says none: only views must."""
    will = Status(node=4, state="offline")
    assert Status.decode(will.encode()) == will
