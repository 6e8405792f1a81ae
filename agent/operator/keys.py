"""Where the operator's signing key lives, and loading it for a command."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.jobs.signing import KeyProblem, load_private_key
from agent.operator.connection import OperatorError

DEFAULT_KEY = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "edgegrove" / "operator.key"


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
