"""A device's keys for a job (agent/device/execution.py ``job_keys``): its device key and the
ring the job pinned, or a refusal when the job pinned another key for its node."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.device.config import DeviceConfig
from agent.device.execution import Unfit, job_keys
from agent.jobs.document import JobSpec
from agent.jobs.states import RejectReason
from agent.protocol.keys import key_text, new_private_key, public_of

OURS, THEIRS = new_private_key(), new_private_key()


def device(tmp_path: Path, key: bytes | None) -> DeviceConfig:
    return DeviceConfig(id="pi-1", operator_keys=["x"], state_dir=tmp_path,
                        device_key=key_text(key) if key is not None else None)


def spec(member_keys: dict[str, str]) -> JobSpec:
    return JobSpec(name="j", data="mnist", assignments={"pi-1": 0, "pi-2": 1}, submitted_at=1.0,
                   member_keys=member_keys)


def test_the_job_pins_our_key_and_we_sign_with_it(tmp_path: Path) -> None:
    ring = {"0": key_text(public_of(OURS)), "1": key_text(public_of(THEIRS))}
    keys = job_keys(device(tmp_path, OURS), spec(ring), 0)
    assert keys is not None and keys.own_node == 0
    assert keys.verify(0, b"x", keys.sign(b"x")) and not keys.verify(1, b"x", keys.sign(b"x"))
    assert job_keys(device(tmp_path, OURS), spec({}), 0) is None  # a job without member keys


@pytest.mark.parametrize("ours", [THEIRS, None], ids=["another-key", "no-key"])
def test_a_job_pinning_another_key_for_our_node_is_refused(tmp_path: Path, ours: bytes | None) -> None:
    ring = {"0": key_text(public_of(OURS)), "1": key_text(public_of(THEIRS))}
    with pytest.raises(Unfit) as refused:
        job_keys(device(tmp_path, ours), spec(ring), 0)
    assert refused.value.reason is RejectReason.DEVICE_KEY_MISMATCH


def test_member_keys_name_every_node_or_none() -> None:
    with pytest.raises(ValueError, match="every assigned node"):
        spec({"0": key_text(public_of(OURS))})
