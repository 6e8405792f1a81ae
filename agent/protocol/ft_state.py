"""The states of one FT-tree round at one node, and every transition between them, in one
place (after h11's ``_state.py``).

A round has two sides that move independently:

- the reduce (``Gather``): a node waits for its subtree's contributions to every chunk
  (WAITING), until the wait runs out and it passes on what it has and each unit as it comes
  (PASSING_ON); once every chunk went up and every unit up was ACKed (DELIVERED: not at the
  root) its reduce is done and it asks for the result sooner if it does not come;
- the result (``Outcome``): RUNNING until the result is known (FINISHED: from the root, or
  without one, chunks skipped or our own values kept); past the hard deadline the round is
  OVER and only answers frames.

The result can come while the reduce still waits (the fleet went on without us), so the two
are separate; a trigger that a side does not list for its state is a bug.
"""

from __future__ import annotations

import enum


class Gather(enum.Enum):
    WAITING = "waiting for the subtree"
    PASSING_ON = "passing on what comes"
    DELIVERED = "every unit up delivered"


class Outcome(enum.Enum):
    RUNNING = "running"
    FINISHED = "finished"
    OVER = "over"


class Trigger(enum.Enum):
    WAIT_OVER = "the wait for contributions ran out"
    UP_DELIVERED = "every chunk went up and was ACKed"
    RESULT = "the result is known here"
    DEADLINE = "the hard deadline passed"


GATHER_TRANSITIONS: dict[tuple[Gather, Trigger], Gather] = {
    (Gather.WAITING, Trigger.WAIT_OVER): Gather.PASSING_ON,
    (Gather.WAITING, Trigger.UP_DELIVERED): Gather.DELIVERED,
    (Gather.PASSING_ON, Trigger.UP_DELIVERED): Gather.DELIVERED,
    # Every chunk went up: what the wait would release is gone already.
    (Gather.DELIVERED, Trigger.WAIT_OVER): Gather.DELIVERED,
}

OUTCOME_TRANSITIONS: dict[tuple[Outcome, Trigger], Outcome] = {
    (Outcome.RUNNING, Trigger.RESULT): Outcome.FINISHED,
    (Outcome.FINISHED, Trigger.DEADLINE): Outcome.OVER,
}


class RoundState:
    def __init__(self) -> None:
        self.gather = Gather.WAITING
        self.outcome = Outcome.RUNNING

    def fire(self, trigger: Trigger) -> None:
        """Move the side(s) ``trigger`` concerns; ValueError when it makes no sense now."""
        if trigger in (Trigger.WAIT_OVER, Trigger.UP_DELIVERED):
            nxt = GATHER_TRANSITIONS.get((self.gather, trigger))
            if nxt is None:
                raise ValueError(f"{trigger.name} in reduce state {self.gather.name}")
            self.gather = nxt
            return
        out = OUTCOME_TRANSITIONS.get((self.outcome, trigger))
        if out is None:
            raise ValueError(f"{trigger.name} in outcome state {self.outcome.name}")
        self.outcome = out

    @property
    def waiting(self) -> bool:
        """The wait for contributions still holds chunks back."""
        return self.gather is Gather.WAITING

    @property
    def over(self) -> bool:
        return self.outcome is Outcome.OVER

    @property
    def finished(self) -> bool:
        return self.outcome is not Outcome.RUNNING
