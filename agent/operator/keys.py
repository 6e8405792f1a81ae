"""Where the operator's signing key lives, and loading it for a command."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.jobs.signing import KeyProblem, load_private_key
from agent.operator.connection import OperatorError
from agent.protocol.keys import key_bytes

DEFAULT_KEY = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "edgegrove" / "operator.key"
# The public halves of the enrolled devices' keys, NAME.pub: `edgegrove enroll` writes them,
# `edgegrove job submit` pins them in the JobSpec (member_keys).
DEFAULT_DEVICE_KEYS = DEFAULT_KEY.parent / "devices"


def add_device_keys_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device-keys", type=Path,
                        default=Path(os.environ.get("EDGEGROVE_DEVICE_KEYS", DEFAULT_DEVICE_KEYS)),
                        help="folder of the enrolled devices' public keys, NAME.pub (`edgegrove enroll` "
                             "writes them); env EDGEGROVE_DEVICE_KEYS")


def device_public_key(folder: Path, device: str) -> str | None:
    """The base64 public key enrolment kept for ``device``; None: not enrolled with one."""
    try:
        text = (folder / f"{device}.pub").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if key_bytes(text) is not None else None


def pinned_member_keys(folder: Path, assignments: dict[str, int]) -> dict[str, str]:
    """node id -> public key of every assigned device, from enrolment; {} when none has one
    (a fleet without device keys). OperatorError when only some have: signed and unsigned
    members cannot form one fleet."""
    found = {device: device_public_key(folder, device) for device in assignments}
    missing = sorted(d for d, key in found.items() if key is None)
    if len(missing) == len(found):
        return {}
    if missing:
        raise OperatorError(f"device {missing[0]} has no enrolled device key in {folder} (enroll it again "
                            "with `edgegrove enroll`): every member of a job signs, or none")
    return {str(assignments[d]): key for d, key in found.items() if key is not None}


def add_key_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", type=Path, default=Path(os.environ.get("EDGEGROVE_OPERATOR_KEY", DEFAULT_KEY)),
                        help="the operator's private key (`edgegrove job keygen`); "
                             "env EDGEGROVE_OPERATOR_KEY")


def signing_key(path: Path) -> Ed25519PrivateKey:
    if not path.is_file():
        raise OperatorError(f"no operator key at {path}: make one with `edgegrove job keygen` "
                            "(or give --key)")
    try:
        return load_private_key(path)
    except KeyProblem as exc:
        raise OperatorError(str(exc)) from None
