"""The first view: when a coordinator publishes it, and whom a node without any view takes it
from.

While no view exists at all, the coordinator waits until ``expected_members`` are live or
``join_grace`` seconds have passed (``StartupGate``), then publishes the first view for the
round it is at (everybody is waiting there). At start-up the lowest id coordinates, so its
model is the fleet's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.protocol.messages import View

# A first view's epoch at most (a fleet publishes a few views a round at most: 2^32 is
# centuries of views), leaving the fleet room to count up to the messages' 2^53.
MAX_FIRST_EPOCH = 2**32


class FirstView(enum.Enum):
    """What a node without any view does with one offered (``first_view``)."""

    TAKE = "take"  # from the coordinator by our own statuses
    WAIT = "wait"  # its publisher is not online here (not heard yet, or gone): held
    NOT_COORDINATOR = "not_coordinator"  # a lower online node coordinates: held, counted
    EPOCH_TOO_HIGH = "epoch_too_high"  # the fleet could never count past it: refused, counted


@dataclass(frozen=True)
class StartupGate:
    """When the first view may be published: ``expected_members`` live, or ``join_grace``
    seconds after ``started_at``. The default never waits."""

    expected_members: int = 0
    join_grace: float = 0.0
    started_at: float = 0.0

    def is_open(self, live: int, now: float) -> bool:
        return live >= self.expected_members or now - self.started_at >= self.join_grace


def first_view(view: View, publisher: int, node: int, states: dict[int, str],
               suspected: frozenset[int]) -> FirstView:
    """Whether ``node`` takes ``view`` from ``publisher`` as the first view it knows (``states``:
    the nodes' latest statuses there): only from the node its own statuses say coordinates (the
    lowest online one, leaving ``node`` out: it may be a lower id that (re)joins a fleet that
    went on without it), with an epoch the fleet can still count up from. Before, any member's
    view was taken: one published before the fleet's first made its publisher root for the
    whole run."""
    if view.epoch > MAX_FIRST_EPOCH:
        return FirstView.EPOCH_TOO_HIGH
    if states.get(publisher) != "online":
        return FirstView.WAIT  # not heard yet, or gone (a stale retained view): held
    lower = [n for n, s in states.items()
             if s == "online" and n < publisher and n != node and n not in suspected]
    return FirstView.NOT_COORDINATOR if lower else FirstView.TAKE
