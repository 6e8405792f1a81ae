"""`edgegrove simulate`'s periodic-averaging flags: --sync-every, --comm-share, --outer-optimizer,
--outer-lr, and --straggler-deadline (for every-step averaging too).

They become the agents' options of those names (agent/config.py);
a bad value is refused by argparse, one line and exit 2, before anything starts.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from agent.config import parse_sync_every
from agent.model.periodic import OUTER_OPTIMIZERS
from agent.validate import UsageError, arg


def sync_every(text: str) -> int | str:
    try:
        value = parse_sync_every(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    assert value is not None
    return value


def comm_share(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise UsageError(f"comm-share {text!r} is not a number: give a share of the wall time, e.g. 0.2") from None
    if not 0 < value < 1:
        raise UsageError(f"comm-share {text} must be a share of the wall time between 0 and 1, e.g. 0.2")
    return value


def outer_lr(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise UsageError(f"outer-lr {text!r} is not a number: give a learning rate > 0, e.g. 0.7") from None
    if not 0 < value < math.inf:
        raise UsageError(f"outer-lr {text} must be a finite number > 0, e.g. 0.7")
    return value


def straggler_deadline(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise UsageError(f"straggler-deadline {text!r} is not a number: give seconds > 0, e.g. 1.5") from None
    if not 0 < value <= 3600:
        raise UsageError(f"straggler-deadline {text} must be seconds > 0 (at most 3600), e.g. 1.5")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sync-every", type=arg(sync_every), default=None, metavar="H",
                        help="periodic averaging: each agent takes H local optimizer steps, then the "
                             "fleet averages the model delta (a round is then a sync round); auto: the "
                             "coordinator picks H (1..64) so that the sync takes at most --comm-share of the "
                             "wall time; default: average the gradient after every step")
    parser.add_argument("--comm-share", type=arg(comm_share), default=None, metavar="SHARE",
                        help="with --sync-every auto: the share of the wall time the sync may take (default 0.2)")
    parser.add_argument("--straggler-deadline", type=arg(straggler_deadline), default=None, metavar="SECONDS",
                        help="ft-tree: a member slower than the rest is waited for this long per round at "
                             "most, then left out of that round's average like a silent member; default: "
                             "wait as the round deadline and the links say")
    parser.add_argument("--outer-optimizer", choices=OUTER_OPTIMIZERS, default=None,
                        help="with --sync-every: avg (FedAvg / local SGD, the default) or nesterov (DiLoCo)")
    parser.add_argument("--outer-lr", type=arg(outer_lr), default=None,
                        help="with --sync-every: the outer learning rate (default 1 for avg, 0.7 for nesterov)")


def agent_options(args: argparse.Namespace) -> dict[str, Any]:
    """The agent options the flags set (none when not given)."""
    if args.sync_every is None and (args.outer_optimizer is not None or args.outer_lr is not None):
        raise UsageError("--outer-optimizer and --outer-lr apply to periodic averaging: give --sync-every H too")
    if args.comm_share is not None and args.sync_every != "auto":
        raise UsageError("--comm-share applies to --sync-every auto")
    chosen = {"sync_every": args.sync_every, "comm_share": args.comm_share,
              "straggler_deadline": args.straggler_deadline,
              "outer_optimizer": args.outer_optimizer, "outer_lr": args.outer_lr}
    return {k: v for k, v in chosen.items() if v is not None}
