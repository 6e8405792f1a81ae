"""Check Ed25519 signatures in a child process: the device's way to use ``cryptography``.

    python -m agent.jobs.verify < {"keys": [base64 raw key...], "messages": [base64 envelope...]}
    -> {"verdicts": [{"payload": "..."} | {"reason": "<RejectReason>", "line": "..."}]}

The device daemon (agent/device/verifier.py) runs this for the signed messages that reach it
(a job, a stop): a few a day, each ~0.2 s, and the library's memory goes with the child.
"""

from __future__ import annotations

import base64
import json
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agent.jobs.envelope import Refused
from agent.jobs.signing import KeyRing, verify_bytes


def verdicts(request: dict[str, list[str]]) -> list[dict[str, str]]:
    ring = KeyRing.of(Ed25519PublicKey.from_public_bytes(base64.b64decode(k)) for k in request["keys"])
    out = []
    for message in request["messages"]:
        verdict = verify_bytes(base64.b64decode(message), ring)
        out.append({"reason": verdict.reason.value, "line": str(verdict)} if isinstance(verdict, Refused)
                   else {"payload": verdict.payload})
    return out


def main() -> int:
    json.dump({"verdicts": verdicts(json.load(sys.stdin))}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
