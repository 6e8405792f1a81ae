from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.jobs import signing
from agent.jobs.document import ControlMessage, JobSpec
from agent.jobs.states import RejectReason

OPERATOR = signing.generate_key()
STRANGER = signing.generate_key()
RING = signing.KeyRing.parse([signing.public_key_text(OPERATOR)])
JOB = JobSpec(name="j", data="mnist", assignments={"a": 0}, submitted_at=5.0)


def refused(raw: bytes) -> RejectReason:
    with pytest.raises(signing.Refused) as caught:
        signing.open_signed(raw, RING, JobSpec)
    return caught.value.reason


def test_a_signed_job_opens_with_the_operator_key() -> None:
    raw = signing.envelope_bytes(signing.sign(JOB, OPERATOR))
    assert signing.open_signed(raw, RING, JobSpec) == JOB


def test_another_key_is_unknown() -> None:
    assert refused(signing.envelope_bytes(signing.sign(JOB, STRANGER))) is RejectReason.UNKNOWN_KEY


def test_another_key_claiming_the_operator_key_id_is_a_bad_signature() -> None:
    forged = signing.sign(JOB, STRANGER).model_copy(update={"key_id": signing.key_id(OPERATOR)})
    assert refused(signing.envelope_bytes(forged)) is RejectReason.BAD_SIGNATURE


def test_a_tampered_payload_is_a_bad_signature() -> None:
    envelope = signing.sign(JOB, OPERATOR)
    payload = json.loads(envelope.payload)
    payload["assignments"] = {"a": 0, "evil": 1}
    tampered = envelope.model_copy(update={"payload": json.dumps(payload)})
    assert refused(signing.envelope_bytes(tampered)) is RejectReason.BAD_SIGNATURE


def test_garbage_and_wrong_kinds_are_invalid_documents() -> None:
    assert refused(b"not json") is RejectReason.INVALID_DOCUMENT
    assert refused(json.dumps(JOB.model_dump(mode="json")).encode()) is RejectReason.INVALID_DOCUMENT
    control = ControlMessage.model_validate({"job": "j", "action": "stop", "issued_at": 1.0})
    assert refused(signing.envelope_bytes(signing.sign(control, OPERATOR))) is RejectReason.INVALID_DOCUMENT


def test_bad_base64_signature_is_a_bad_signature() -> None:
    envelope = signing.sign(JOB, OPERATOR).model_copy(update={"signature": "***"})
    assert refused(signing.envelope_bytes(envelope)) is RejectReason.BAD_SIGNATURE


def test_keys_load_from_text_files_and_pem(tmp_path: Path) -> None:
    private = tmp_path / "operator.key"
    private.write_text(signing.private_key_text(OPERATOR))
    assert signing.key_id(signing.load_private_key(private)) == signing.key_id(OPERATOR)
    public = tmp_path / "operator.pub"
    public.write_text(signing.public_key_text(OPERATOR) + "\n")
    from cryptography.hazmat.primitives import serialization

    pem = OPERATOR.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "operator.pem").write_bytes(pem)
    ring = signing.KeyRing.parse([str(public), str(tmp_path / "operator.pem")])
    assert list(ring.keys) == [signing.key_id(OPERATOR)]


@pytest.mark.parametrize("text", ["", "abc", "AAAA", "/nonexistent/key.pub"])
def test_unusable_public_keys_say_so(text: str) -> None:
    with pytest.raises(signing.KeyProblem):
        signing.parse_public_key(text)
