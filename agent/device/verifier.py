"""The device's signature checks: what needs no cryptography here, the rest in a child process.

An envelope that does not parse, or names a key this device does not trust, is refused at once;
only a real signature check starts ``python -m agent.jobs.verify`` (agent/jobs/envelope.py says
why). Verdicts are kept by the message's hash: a retained job delivered again after a
reconnect is not checked again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import subprocess
import sys

from agent.jobs.envelope import Refused, Verdict, Verified, key_id_of, parse_envelope
from agent.jobs.states import RejectReason
from agent.validate import one_line

log = logging.getLogger("edgegrove.device")
CHECK_TIMEOUT_S = 60.0
CACHE_LIMIT = 1024


class Verifier:
    def __init__(self, keys: list[bytes], command: list[str] | None = None) -> None:
        self.keys = {key_id_of(k): k for k in keys}
        self.command = command or [sys.executable, "-m", "agent.jobs.verify"]
        self.cache: dict[str, Verdict] = {}

    def check(self, raw: bytes) -> Verdict:
        return self.check_all([raw])[0]

    def check_all(self, raws: list[bytes]) -> list[Verdict]:
        """A verdict for each message, in order (one child process for all that need it)."""
        digests = [hashlib.sha256(r).hexdigest() for r in raws]
        pending = {d: r for d, r in zip(digests, raws, strict=True) if d not in self.cache}
        needs_child = {}
        for digest, raw in pending.items():
            quick = self._without_crypto(raw)
            if quick is None:
                needs_child[digest] = raw
            else:
                self._keep(digest, quick)
        if needs_child:
            for digest, verdict in zip(needs_child, self._in_child(list(needs_child.values())), strict=True):
                if verdict is not None:
                    self._keep(digest, verdict)
        unchecked = Refused(RejectReason.BAD_SIGNATURE, "the signature could not be checked (see the log)")
        return [self.cache.get(d, unchecked) for d in digests]

    def _without_crypto(self, raw: bytes) -> Verdict | None:
        try:
            envelope = parse_envelope(raw)
        except Refused as refusal:
            return refusal
        if envelope.key_id not in self.keys:
            return Refused(RejectReason.UNKNOWN_KEY, f"signed with key {one_line(envelope.key_id)[:32]!r}, "
                           "which is not among this device's operator keys")
        return None

    def _in_child(self, raws: list[bytes]) -> list[Verdict | None]:
        request = {"keys": [base64.b64encode(k).decode() for k in self.keys.values()],
                   "messages": [base64.b64encode(r).decode() for r in raws]}
        try:
            done = subprocess.run(self.command, input=json.dumps(request), capture_output=True, text=True,
                                  timeout=CHECK_TIMEOUT_S, check=True)
            answers = json.loads(done.stdout)["verdicts"]
            return [Verified(a["payload"]) if "payload" in a else Refused(RejectReason(a["reason"]), a["line"])
                    for a in answers]
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as exc:
            log.error("cannot check signatures (%s): the messages are refused for now",
                      one_line(str(exc))[:300])
            return [None] * len(raws)

    def _keep(self, digest: str, verdict: Verdict) -> None:
        if len(self.cache) >= CACHE_LIMIT:
            self.cache.pop(next(iter(self.cache)))
        self.cache[digest] = verdict
