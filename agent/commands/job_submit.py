"""`edgegrove job submit job.toml`: check a job, assign its devices, publish it signed.

1. The job file is read and checked, and its model loaded and probed as `edgegrove model
   check` does; anything wrong is one line and exit 2, before anything is published.
2. The devices come from their retained records (`edgegrove devices`): those the selector
   matches that are online and hold the data source get node ids 0..n-1 (sorted by id).
   Fewer than min_devices, or no device with the data source: one line, exit 2.
3. The model file goes out as retained content-addressed chunks (edgegrove/blobs/<sha256>/<i>),
   the devices' training topics in the job are granted through dynamic security (when the
   broker has it), and the job document, signed with the operator key, is published retained
   on edgegrove/jobs/<name>/spec. Every assigned device then reports its execution state.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
import time
import uuid
from pathlib import Path

from agent.jobs import topics
from agent.jobs.document import BlobRef, JobSpec
from agent.jobs.signing import envelope_bytes, sign
from agent.model.contract import ModelError
from agent.operator import grants
from agent.operator.assign import AssignError
from agent.operator.blobs import blob_ref, cut
from agent.operator.connection import (
    BrokerLogin,
    OperatorClient,
    OperatorError,
    add_broker_arguments,
    login_from_args,
)
from agent.operator.fleet import FleetView
from agent.operator.jobfile import JobFileError, read_job_file
from agent.operator.keys import (
    add_device_keys_argument,
    add_key_argument,
    pinned_member_keys,
    signing_key,
)
from agent.operator.submit import build_spec, check_model
from agent.validate import arg, input_file

DESCRIPTION = __doc__
PROG = "edgegrove job submit"
DYNSEC_WAIT_S = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_file", type=arg(input_file), help="the job file (TOML; docs/DEVICES.md)")
    add_key_argument(parser)
    add_device_keys_argument(parser)
    parser.add_argument("--grants", choices=("auto", "dynsec", "none"), default="auto",
                        help="grant each device its node's training topics through dynamic security: "
                             "auto (when the broker answers), dynsec (required), none")
    parser.add_argument("--device-user", default=None,
                        help="a device's MQTT user name, {device} standing for its id (default: "
                             "device-{device}, as make-credentials --devices and `edgegrove enroll` make them)")
    parser.add_argument("--replace", action="store_true",
                        help="replace a job of the same name (its states and result are cleared)")
    parser.add_argument("--dry-run", action="store_true", help="check and assign, publish nothing")
    add_broker_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        job = read_job_file(Path(args.job_file))
        checked = check_model(job)
        key = signing_key(args.key)
        login = login_from_args(args)
        ref, blob = (blob_ref(checked.path, checked.factory) if checked.path else (None, b""))
        with OperatorClient(login, [topics.all_device_records(), topics.job_spec(job.name)]) as client:
            view = FleetView().take_all(client.sync())
            if job.name in view.jobs and not args.replace:
                raise OperatorError(f"job {job.name} exists already: pick another name, or --replace it")
            spec, chosen = build_spec(job, view.devices, ref, time.time(), _submitter())
            # Trust from enrolment, not from the records: the keys enroll kept, pinned and signed.
            spec = spec.model_copy(update={"member_keys": pinned_member_keys(args.device_keys, spec.assignments)})
            for device, why in chosen.skipped.items():
                print(f"{PROG}: skipped {device}: {why}", file=sys.stderr)
            if args.dry_run:
                _say(args, spec, checked.fingerprint, "checked (dry run, nothing published)")
                return 0
            if args.replace:
                _clear(client, login, job.name)
            _publish_blob(client, ref, blob)
            _grant(args, login, spec)
            client.publish(topics.job_spec(spec.name), envelope_bytes(sign(spec, key)))
            client.sync()
    except (JobFileError, ModelError, AssignError, OperatorError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    _say(args, spec, checked.fingerprint, "submitted")
    return 0


def _submitter() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return socket.gethostname()


def _publish_blob(client: OperatorClient, ref: BlobRef | None, blob: bytes) -> None:
    if ref is None:
        return
    for index, chunk in enumerate(cut(blob, ref.chunk_size)):
        client.publish(topics.blob_chunk(ref.sha256, index), chunk)
    client.sync()


def _clear(client: OperatorClient, login: BrokerLogin, job: str) -> None:
    """Empty every retained topic of an earlier job of this name (spec, control, states, result)."""
    with OperatorClient(login, [f"{topics.ROOT}/jobs/{job}/#"]) as reader:
        old = [m.topic for m in reader.sync() if m.payload]
    for topic in old:
        client.publish(topic, b"")


def _grant(args: argparse.Namespace, login: BrokerLogin, spec: JobSpec) -> None:
    if args.grants == "none":
        return
    commands = grants.grant_commands(spec.name, spec.assignments, args.device_user)
    responses = dynsec(login, commands, DYNSEC_WAIT_S)
    if responses is None:
        if args.grants == "dynsec":
            raise OperatorError("the broker did not answer dynamic-security commands "
                                "(no plugin, or these credentials may not manage it)")
        print(f"{PROG}: no dynamic security on this broker: the devices' own ACL patterns apply",
              file=sys.stderr)
        return
    problems = [p for c, r in zip(commands, responses, strict=True) if (p := grants.refused(c, r))]
    if problems:
        raise OperatorError(f"dynamic security refused the grants: {problems[0]}")


def dynsec(login: BrokerLogin, commands: list[dict[str, object]], wait: float) -> list[dict[str, object]] | None:
    """The plugin's responses to ``commands`` in order, None when it does not answer."""
    tagged = [{**c, "correlationData": uuid.uuid4().hex} for c in commands]
    with OperatorClient(login, [grants.DYNSEC_RESPONSE]) as client:
        client.publish(grants.DYNSEC_TOPIC, json.dumps({"commands": tagged}).encode(), retain=False)
        wanted = {str(c["correlationData"]): i for i, c in enumerate(tagged)}
        got: dict[int, dict[str, object]] = {}
        for message in client.messages(time.monotonic() + wait):
            for response in _responses(message.payload):
                if (index := wanted.get(str(response.get("correlationData")))) is not None:
                    got[index] = response
            if len(got) == len(tagged):
                return [got[i] for i in range(len(tagged))]
    return None


def _responses(payload: bytes) -> list[dict[str, object]]:
    try:
        found = json.loads(payload).get("responses", [])
    except (ValueError, AttributeError):
        return []
    return [r for r in found if isinstance(r, dict)]


def _say(args: argparse.Namespace, spec: JobSpec, fingerprint: str, what: str) -> None:
    if args.json:
        print(json.dumps({"job": spec.name, "result": what.split(" ")[0], "fingerprint": fingerprint,
                          "assignments": spec.assignments, "spec": spec.model_dump(mode="json")}))
        return
    devices = ", ".join(f"{d}={n}" for d, n in sorted(spec.assignments.items(), key=lambda i: i[1]))
    model = spec.model if isinstance(spec.model, str) else f"{spec.model.filename} ({spec.model.size:,} bytes)"
    print(f"{what} job {spec.name}: model {model}, fingerprint {fingerprint}, data {spec.data} "
          f"({spec.partition}), {len(spec.assignments)} devices (node ids: {devices})")
    if what == "submitted":
        print(f"follow it with `edgegrove job status {spec.name}`; the trained model: "
              f"`edgegrove job fetch {spec.name} -o DIR`")
