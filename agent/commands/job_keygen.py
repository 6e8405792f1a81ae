"""`edgegrove job keygen`: the operator's Ed25519 key pair.

Writes ``operator.key`` (the private key, mode 0600: keep it on the operator's workstation)
and ``operator.pub`` (the public key: list it, or its text, under ``operator_keys`` in every
device.toml). `job submit` and `job stop` sign with the private key.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agent.jobs.signing import generate_key, key_id, private_key_text, public_key_text
from agent.operator.keys import DEFAULT_KEY

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_KEY.parent,
                        help="folder for operator.key and operator.pub")
    parser.add_argument("--force", action="store_true", help="replace a key pair already there")


def run(args: argparse.Namespace) -> int:
    private, public = args.out / "operator.key", args.out / "operator.pub"
    if private.exists() and not args.force:
        print(f"job keygen: {private} exists; devices trust its public key (use --force to "
              "replace it, then give the devices the new operator.pub)", file=sys.stderr)
        return 2
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        key = generate_key()
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(private_key_text(key) + "\n")
        os.chmod(private, 0o600)
        public.write_text(public_key_text(key) + "\n")
    except OSError as exc:
        print(f"job keygen: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {private} (private, keep it here) and {public}\n"
          f"key id {key_id(key)}; in each device.toml:  operator_keys = [\"{public_key_text(key)}\"]")
    return 0
