"""`edgegrove job stop JOB`: publish the signed stop control; the devices end the job within
two rounds and the coordinator's device publishes the result so far (`job fetch`)."""

from __future__ import annotations

import argparse
import json
import time

from agent.jobs import topics
from agent.jobs.document import ControlMessage
from agent.jobs.signing import envelope_bytes, sign
from agent.jobs.states import ControlAction
from agent.operator.connection import (
    OperatorClient,
    OperatorError,
    add_broker_arguments,
    login_from_args,
    one_line_errors,
)
from agent.operator.fleet import FleetView
from agent.operator.keys import add_key_argument, signing_key
from agent.operator.tables import last_round, states_summary
from agent.validate import arg

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", type=arg(topics.validate_job_name), help="the job's name")
    add_key_argument(parser)
    parser.add_argument("--wait", type=float, default=0.0,
                        help="seconds to wait for every device of the job to reach an end state")
    add_broker_arguments(parser)


@one_line_errors("edgegrove job stop")
def run(args: argparse.Namespace) -> int:
    key = signing_key(args.key)
    filters = [topics.job_spec(args.job), topics.job_execs(args.job)]
    with OperatorClient(login_from_args(args), filters) as client:
        view = FleetView().take_all(client.sync())
        if args.job not in view.jobs:
            raise OperatorError(f"no job {args.job} on this broker (see `edgegrove job list`)")
        at_stop = last_round(view.execs.get(args.job, {}))[0]
        control = ControlMessage(job=args.job, action=ControlAction.STOP, issued_at=time.time())
        client.publish(topics.job_control(args.job), envelope_bytes(sign(control, key)))
        client.sync()
        ended = _wait(client, view, args.job, args.wait)
    execs = view.execs.get(args.job, {})
    summary, final = states_summary(view.jobs[args.job], execs), last_round(execs)[0]
    if args.json:
        print(json.dumps({"job": args.job, "stop": "published", "ended": ended, "states": summary,
                          "round_at_stop": at_stop, "last_round": final}))
    else:
        rounds = f"; round {at_stop} when published" if at_stop is not None else ""
        if ended and final is not None:
            rounds += f", ended at round {final}"
        print(f"stop published for job {args.job}{rounds}; states: {summary}")
    return 0 if ended or args.wait <= 0 else 1


def _wait(client: OperatorClient, view: FleetView, job: str, seconds: float) -> bool:
    """Whether every assigned device reached an end state within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        execs = view.execs.get(job, {})
        if all(d in execs and execs[d].state.terminal for d in view.jobs[job].assignments):
            return True
        if time.monotonic() >= deadline:
            return False
        for message in client.messages(min(deadline, time.monotonic() + 1.0)):
            view.take(message)
