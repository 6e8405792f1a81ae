"""`edgegrove job fetch JOB -o DIR`: the trained model a job returned, written for use.

Reads the job's result (the manifest its coordinator's device published and the parameters'
chunks, hash-checked) and writes into DIR:

    model.npz      the trained tensors by name (`edgegrove model evaluate DIR/model.npz --data ...`)
    model.tflite   an inference model, infer(x) -> scores, with the trained weights: runs on
                   ai-edge-litert alone (a phone, a Pi)
    metrics.json   round, accuracy, loss, hashes, each device's final state
    source/        the job's own model file (when it was sent as one)
    model.keras    with --keras SOURCE and TensorFlow: that Keras model with the trained weights
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from agent.jobs import topics
from agent.jobs.document import BlobRef, ResultManifest
from agent.model.contract import F32
from agent.operator.blobs import ResultError, assemble
from agent.operator.connection import (
    BrokerLogin,
    OperatorClient,
    OperatorError,
    add_broker_arguments,
    login_from_args,
)
from agent.operator.fleet import FleetView
from agent.operator.results import LayoutError, write_result
from agent.operator.tables import percent
from agent.operator.tflite_writer import TfliteWriteError
from agent.validate import arg, output_dir

DESCRIPTION = __doc__
PROG = "edgegrove job fetch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", type=arg(topics.validate_job_name), help="the job's name")
    parser.add_argument("-o", "--out", type=arg(output_dir), required=True, help="the folder to write into")
    parser.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the result to appear")
    parser.add_argument("--keras", default=None, metavar="SOURCE",
                        help="the Keras model the job's .tflite was exported from (.keras or file.py:function): "
                             "write model.keras with the trained weights (needs TensorFlow)")
    add_broker_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        manifest, params, blob = fetch(args)
        written = write_result(Path(args.out), manifest, params, blob, args.keras)
    except (OperatorError, ResultError, LayoutError, TfliteWriteError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    for note in written.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"job": manifest.job, "round": manifest.round, "accuracy": manifest.accuracy,
                          "files": [str(f) for f in written.files], "notes": written.notes}))
    else:
        print(f"job {manifest.job}: round {manifest.round}, accuracy {percent(manifest.accuracy)}, "
              f"{manifest.values:,} parameters (sha256 {manifest.params_sha256[:12]}...) -> "
              + ", ".join(str(f) for f in written.files))
    return 0


def fetch(args: argparse.Namespace) -> tuple[ResultManifest, F32, bytes | None]:
    login = login_from_args(args)
    filters = [topics.job_result(args.job), topics.job_result_chunks(args.job), topics.job_execs(args.job)]
    with OperatorClient(login, filters) as client:
        view = FleetView().take_all(client.sync())
        deadline = time.monotonic() + args.wait
        while not _complete(view, args.job) and time.monotonic() < deadline:
            for message in client.messages(min(deadline, time.monotonic() + 1.0)):
                view.take(message)
    manifest = view.results.get(args.job)
    if manifest is None:
        states = sorted({str(s.state) for s in view.execs.get(args.job, {}).values()})
        raise OperatorError(f"job {args.job} has no result yet (device states: {', '.join(states) or 'none'}); "
                            "it comes when the job ends (stop rule or `edgegrove job stop`)")
    params = assemble(manifest, view.result_chunks.get(args.job, {}))
    blob = _blob(login, manifest.model) if isinstance(manifest.model, BlobRef) else None
    return manifest, params, blob


def _complete(view: FleetView, job: str) -> bool:
    manifest = view.results.get(job)
    return manifest is not None and len(view.result_chunks.get(job, {})) >= manifest.chunks


def _blob(login: BrokerLogin, ref: BlobRef) -> bytes:
    """The job's model file from its retained chunks, hash-checked."""
    with OperatorClient(login, [topics.blob_chunks(ref.sha256)]) as client:
        chunks = FleetView().take_all(client.sync()).blob_chunks.get(ref.sha256, {})
    data = b"".join(chunks.get(i, b"") for i in range(ref.chunks))
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise ResultError(f"the job's model file {ref.filename} is not whole on the broker "
                          f"({len(chunks)} of {ref.chunks} chunks, hash mismatch)")
    return data
