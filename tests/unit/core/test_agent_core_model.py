"""One model per fleet, as the agent core (agent/core/) lives it: the model it announces in
its status, its refusal by a fleet of another model (said once, then done), and frames of
another model rejected as a foreign job (the job hash mixes in the fingerprint)."""

from __future__ import annotations

import numpy as np

from agent.config import AgentConfig
from agent.core import AgentCore, CoreConfig, Phase
from agent.core.events import MessageArrived, StatusSeen, ViewSeen
from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.membership import ModelIdentity, Refusal
from agent.protocol.messages import Status, View
from agent.protocol.wire import Frame, Kind, encode, job_hash
from agent.runtime_config import core_config

OURS = ModelIdentity("0123456789abcdef", "digits-mlp", 2410)
THEIRS = ModelIdentity("fedcba9876543210", "mnist-cnn", 1234)


def _core(node: int, model: ModelIdentity) -> AgentCore:
    allreduce = AllreduceConfig(job=job_hash("default", model.fingerprint), chunk_size=8,
                                timeout_mode="fixed", fixed_timeout=0.05)
    return AgentCore(CoreConfig(node=node, rounds=5, allreduce=allreduce, state_size=4,
                                model=model, labels=(3, 0, 9)), 7)


def _status(node: int, model: ModelIdentity) -> Status:
    return Status(node, "online", fingerprint=model.fingerprint, model=model.name, params=model.params)


def test_the_status_announces_the_model_and_the_label_histogram() -> None:
    status = _core(2, OURS).status("online")
    assert (status.fingerprint, status.model, status.params) == (OURS.fingerprint, "digits-mlp", 2410)
    assert status.labels == [3, 0, 9]
    assert Status.decode(status.encode()) == status


def test_an_agent_with_another_model_is_refused_once_and_stops() -> None:
    core = _core(2, OURS)
    view = View(1, [0, 1], 2, 0, 0, fingerprint=THEIRS.fingerprint, model=THEIRS.name, params=THEIRS.params)
    assert core.handle(ViewSeen(view, publisher=0), 0.0) == []  # its coordinator not heard yet
    out = core.handle(StatusSeen(_status(0, THEIRS)), 0.1)
    assert len(out) == 1 and isinstance(out[0], Refusal) and core.phase == Phase.DONE
    assert out[0].own == OURS and out[0].fleet == THEIRS and out[0].coordinator == 0
    assert core.handle(StatusSeen(_status(1, THEIRS)), 0.2) == []  # said once


def test_the_same_model_takes_the_view_and_trains() -> None:
    core = _core(1, OURS)
    core.handle(ViewSeen(View(1, [0, 1], 2, 0, 0, fingerprint=OURS.fingerprint), publisher=0), 0.0)
    for node in (0, 1):
        core.handle(StatusSeen(Status(node, "online", incarnation=7 if node == 1 else 0,
                                     fingerprint=OURS.fingerprint)), 0.0)
    assert core.parts.membership.admission.refused is None and core.phase != Phase.DONE
    assert core.parts.membership.views.members_for(0) == (0, 1)


def test_frames_of_another_model_are_rejected_as_a_foreign_job() -> None:
    core = _core(1, OURS)
    core.handle(ViewSeen(View(1, [0, 1], 2, 0, 0, fingerprint=OURS.fingerprint), publisher=0), 0.0)
    core.handle(StatusSeen(Status(1, "online", incarnation=7, fingerprint=OURS.fingerprint)), 0.0)
    theirs = Frame(Kind.DATA, job_hash("default", THEIRS.fingerprint), 0, 0, 0, 1)
    theirs = theirs.with_values(np.ones(4, np.float32))
    core.handle(MessageArrived(core.parts.topics.link(0, 1), encode(theirs)), 0.01)
    assert core.parts.counters.rejected["foreign_job"] == 1


def test_the_job_hash_mixes_in_the_fingerprint() -> None:
    config = AgentConfig(id=0, job="barn")
    plain = core_config(config, 4)
    assert plain.allreduce.job == job_hash("barn")  # no model said: as before
    ours, theirs = core_config(config, 4, OURS), core_config(config, 4, THEIRS)
    assert len({plain.allreduce.job, ours.allreduce.job, theirs.allreduce.job}) == 3
    assert ours.model == OURS and ours.allreduce.job == job_hash("barn", OURS.fingerprint)
