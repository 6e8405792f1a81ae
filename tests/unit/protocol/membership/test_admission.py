"""Joining and admission (agent/protocol/membership/admission.py): one model per fleet, a view
of another model held until its coordinator is heard, and members back as a new life."""

from __future__ import annotations

from agent.protocol.membership.admission import Admission, ModelIdentity
from agent.protocol.messages import NodeState, Status, View

OURS = ModelIdentity("0123456789abcdef", "mlp", 10)
THEIRS = ModelIdentity("fedcba9876543210", "cnn", 20)


def _status(node: int, model: ModelIdentity, state: NodeState = "online", incarnation: int = 0) -> Status:
    return Status(node, state, incarnation=incarnation, fingerprint=model.fingerprint, model=model.name,
                  params=model.params)


def _view(model: ModelIdentity, coordinator: int = 0) -> View:
    return View(epoch=1, members=[0, 1], arity=2, coordinator=coordinator, from_round=0,
                fingerprint=model.fingerprint, model=model.name, params=model.params)


def test_a_node_of_another_model_is_foreign_until_a_new_life_runs_ours() -> None:
    admission = Admission(OURS)
    admission.heard(_status(2, THEIRS))
    assert admission.foreign == {2} and admission.models == {2: THEIRS.fingerprint}
    admission.heard(_status(2, OURS, incarnation=1))
    assert admission.foreign == set()
    admission.heard(_status(2, THEIRS, state="offline", incarnation=1))
    assert admission.models == {}


def test_a_view_of_another_model_is_held_until_its_coordinator_is_heard_running_it() -> None:
    admission = Admission(OURS)
    assert admission.takes(_view(OURS)) and admission.takes(_view(ModelIdentity()))
    assert not admission.takes(_view(THEIRS)) and admission.unconfirmed == _view(THEIRS)
    assert admission.refused is None
    assert admission.heard(_status(0, THEIRS)) == _view(THEIRS)  # to be offered again
    assert not admission.takes(_view(THEIRS))
    assert admission.refused is not None and admission.refused.fleet == THEIRS


def test_a_member_back_with_a_newer_incarnation_is_a_new_life() -> None:
    admission = Admission(OURS)
    admission.new_life(_status(1, OURS, incarnation=5), 4, [0, 1])
    admission.new_life(_status(2, OURS, incarnation=5), 4, [0, 1])  # not a member
    admission.new_life(_status(0, OURS, incarnation=4), 4, [0, 1])  # the same life
    assert admission.new_lives == {1}
