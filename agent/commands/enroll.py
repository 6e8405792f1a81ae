"""`edgegrove enroll NAME`: a device's credentials (once, for every job) and its device.toml.

On the operator's workstation. The credentials come from credentials.json written by
`broker-config/make-credentials --devices NAME,...` (--from-credentials), or are made now on
a running dynamic-security broker with the operator's login (--create). The device.toml
written (mode 0600: it holds the device's password and its device key) names the broker, the
operator's public key, the labels and data sources given, and a new Ed25519 device key, whose
public half goes to the operator's side (--device-keys/NAME.pub): `job submit` pins it in the
job, and the device signs its control messages with it (agent/protocol/keys.py); copy it to the device (/etc/edgegrove/device.toml)
and start `edgegrove device --config /etc/edgegrove/device.toml` (docs/DEVICES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

from agent.jobs.acl import create_commands, device_user
from agent.jobs.document import validate_source_name
from agent.jobs.signing import KeyProblem, parse_public_key, public_key_text
from agent.jobs.topics import validate_device
from agent.protocol.keys import key_text, new_private_key, public_of
from agent.validate import arg, broker_url

DESCRIPTION = __doc__
FORMATS = ("npz", "csv", "images", "mnist", "digits")
DYNSEC_WAIT_S = 5.0


class EnrollError(ValueError):
    """One line: what keeps the enrolment from going on (exit 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agent.operator.connection import add_broker_arguments
    from agent.operator.keys import DEFAULT_KEY, add_device_keys_argument

    parser.add_argument("name", type=arg(validate_device), help="the device's name ([a-z0-9-])")
    parser.add_argument("-o", "--out", type=Path, default=None, help="folder for device.toml (default ./NAME)")
    parser.add_argument("--operator-key", action="append", default=None,
                        help=f"operator public key (base64 or a .pub file; default {DEFAULT_KEY.with_suffix('.pub')})")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--from-credentials", type=Path, help="credentials.json of make-credentials --devices")
    how.add_argument("--create", action="store_true",
                     help="make the device's client on the running dynamic-security broker (--broker, "
                          "operator login)")
    parser.add_argument("--device-broker", type=arg(broker_url), default=None,
                        help="the broker URL as the device reaches it (default: --broker)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--data", action="append", default=[], metavar="NAME=FORMAT[:PATH]",
                        help=f"a data source on the device; FORMAT one of {', '.join(FORMATS)}")
    parser.add_argument("--state-dir", default="/var/lib/edgegrove", help="the device's state directory")
    add_device_keys_argument(parser)
    add_broker_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from agent.operator.connection import OperatorError

    try:
        keys = _operator_keys(args.operator_key)
        labels = dict(_pair(text, "=", "--label") for text in args.label)
        data = [_data_source(text) for text in args.data]
        password = _from_file(args.from_credentials, args.name) if args.from_credentials else _create(args)
        out = args.out or Path(args.name)
        device_key = new_private_key()
        path = _write(out, _toml(args, keys, labels, data, password, device_key))
        public = _keep_public_key(args.device_keys, args.name, public_of(device_key))
    except (EnrollError, OperatorError) as exc:
        print(f"edgegrove enroll: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} for device {args.name} (user {device_user(args.name)}); copy it to the device "
          f"as /etc/edgegrove/device.toml and start `edgegrove device --config /etc/edgegrove/device.toml`; "
          f"its device key's public half: {public}")
    return 0


def _keep_public_key(folder: Path, name: str, public: bytes) -> Path:
    """The device key's public half where `job submit` pins it from (a re-enrolment replaces it)."""
    path = folder / f"{name}.pub"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(key_text(public) + "\n")
    except OSError as exc:
        raise EnrollError(f"cannot write {path}: {exc}") from None
    return path


def _operator_keys(given: list[str] | None) -> list[str]:
    from agent.operator.keys import DEFAULT_KEY

    texts = given or [str(DEFAULT_KEY.with_suffix(".pub"))]
    try:
        return [public_key_text(parse_public_key(t)) for t in texts]
    except KeyProblem as exc:
        raise EnrollError(f"{exc} (make one with `edgegrove job keygen`)") from None


def _pair(text: str, sep: str, what: str) -> tuple[str, str]:
    key, found, value = text.partition(sep)
    if not found or not key:
        raise EnrollError(f"{what} {text!r}: give {'KEY=VALUE' if sep == '=' else 'NAME=FORMAT[:PATH]'}")
    return key, value


def _data_source(text: str) -> tuple[str, str, str]:
    name, spec = _pair(text, "=", "--data")
    fmt, _, path = spec.partition(":")
    try:
        validate_source_name(name)
    except ValueError as exc:
        raise EnrollError(f"--data {text!r}: {exc}") from None
    if fmt not in FORMATS:
        raise EnrollError(f"--data {text!r}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    return name, fmt, path


def _from_file(path: Path, name: str) -> str:
    try:
        entry = json.loads(path.read_text())["devices"][name]
        return str(entry["password"])
    except (OSError, ValueError, KeyError, TypeError):
        raise EnrollError(f"{path} has no devices.{name} entry: run broker-config/make-credentials "
                          f"--devices {name},... (or use --create)") from None


def _create(args: argparse.Namespace) -> str:
    from agent.commands.job_submit import dynsec
    from agent.operator.connection import login_from_args

    password = secrets.token_urlsafe(18)
    commands = create_commands(args.name, password)
    responses = dynsec(login_from_args(args), commands, DYNSEC_WAIT_S)
    if responses is None:
        raise EnrollError(f"the broker at {args.broker} did not answer on dynamic security: is it "
                          "mosquitto with the dynamic-security plugin, and the login the operator's?")
    for command, response in zip(commands, responses, strict=True):
        error = str(response.get("error") or "")
        if error and not (command["command"] == "createRole" and "exists" in error.lower()):
            raise EnrollError(f"dynamic security refused {command['command']} for {args.name}: {error}")
    return password


def _toml(args: argparse.Namespace, keys: list[str], labels: dict[str, str],
          data: list[tuple[str, str, str]], password: str, device_key: bytes) -> str:
    q = json.dumps  # a TOML basic string is a JSON string
    lines = [f"# device {args.name}, written by `edgegrove enroll` (holds its password: mode 0600)",
             f"id = {q(args.name)}", f"broker = {q(args.device_broker or args.broker)}",
             f"username = {q(device_user(args.name))}", f"password = {q(password)}",
             f"operator_keys = [{', '.join(q(k) for k in keys)}]", f"state_dir = {q(args.state_dir)}",
             f"device_key = {q(key_text(device_key))}  # signs this device's control messages in its jobs",
             f"device_public_key = {q(key_text(public_of(device_key)))}"]
    if args.tls_ca:
        lines.append(f"tls_ca = {q('/etc/edgegrove/ca.crt')}  # copy the CA there")
    if labels:
        lines.append("labels = { " + ", ".join(f"{q(k)} = {q(v)}" for k, v in labels.items()) + " }")
    for name, fmt, path in data:
        lines += ["", f"[data.{name}]", f"format = {q(fmt)}"] + ([f"path = {q(path)}"] if path else [])
    return "\n".join(lines) + "\n"


def _write(out: Path, text: str) -> Path:
    path = out / "device.toml"
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    except OSError as exc:
        raise EnrollError(f"cannot write {path}: {exc}") from None
    return path
