"""Signatures checked in a child process; the daemon's own modules never load cryptography."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.device.verifier import Verifier
from agent.jobs import signing
from agent.jobs.document import JobSpec
from agent.jobs.envelope import Refused, Verified
from agent.jobs.states import RejectReason

REPO = Path(__file__).resolve().parents[3]
OPERATOR = signing.generate_key()
STRANGER = signing.generate_key()
JOB = JobSpec(name="j", data="mnist", assignments={"a": 0}, submitted_at=1.0)


def raw_key(key: signing.Ed25519PrivateKey) -> bytes:
    import base64

    return base64.b64decode(signing.public_key_text(key))


def test_the_child_checks_signatures_and_the_rest_is_refused_without_it() -> None:
    calls: list[int] = []

    class Counting(Verifier):
        def _in_child(self, raws: list[bytes]) -> list[Refused | Verified | None]:
            calls.append(len(raws))
            return super()._in_child(raws)

    verifier = Counting([raw_key(OPERATOR)])
    good = signing.envelope_bytes(signing.sign(JOB, OPERATOR))
    envelope = signing.sign(JOB, OPERATOR)
    tampered = signing.envelope_bytes(envelope.model_copy(update={"payload": envelope.payload.replace("1.0", "2.0")}))
    stranger = signing.envelope_bytes(signing.sign(JOB, STRANGER))
    verdicts = verifier.check_all([good, tampered, stranger, b"junk"])
    assert verdicts[0] == Verified(envelope.payload)
    assert [v.reason for v in verdicts[1:] if isinstance(v, Refused)] == [
        RejectReason.BAD_SIGNATURE, RejectReason.UNKNOWN_KEY, RejectReason.INVALID_DOCUMENT]
    assert calls == [2]  # one child for the two that needed a signature check
    verifier.check_all([good, tampered])
    assert calls == [2]  # kept: a retained job delivered again is not checked again


def test_a_child_that_cannot_run_refuses_for_now_and_is_asked_again() -> None:
    verifier = Verifier([raw_key(OPERATOR)], command=[sys.executable, "-c", "raise SystemExit(1)"])
    good = signing.envelope_bytes(signing.sign(JOB, OPERATOR))
    verdict = verifier.check(good)
    assert isinstance(verdict, Refused) and not verifier.cache


def test_the_device_daemon_does_not_load_cryptography() -> None:
    code = ("import sys, json; import agent.commands.device, agent.device.daemon, agent.device.verifier, "
            "agent.device.config; print(json.dumps('cryptography' in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert json.loads(done.stdout) is False
