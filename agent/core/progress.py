"""Where an agent is in its run: the phases, the one table of their transitions (like h11's
_state.py), and ``Progress``, the one owner of the phase, the round, the round under way and
the report held back for the final sync.

``Progress.go(trigger)`` is the only way a phase changes, by ``next_phase``; a pair the table
does not list is a bug in the core, raised as ``PhaseError``, never a silent jump. Joining is a
phase (``Phase.JOINING``), not a flag beside one. Which trigger fires when is the steps'
(agent/core/steps.py, its ``ADVANCE`` table); each trigger's comment says the condition.
"""

from __future__ import annotations

import enum

from agent.core.report import RoundInProgress, RoundReport


class Phase(enum.Enum):
    CONNECTING = "connecting"  # waiting for our own status: does a fleet (a view) exist?
    JOINING = "joining"  # a fleet runs without us: wait to be in a view, fetch its state
    WAITING = "waiting"  # between rounds: waiting for a view that covers our round
    COMPUTING = "computing"  # asked the driver for this round's gradient
    RUNNING = "running"  # the round's machine is reducing and broadcasting
    FINAL_SYNC = "final_sync"  # the last round fell back: waiting (bounded) for the fleet's state
    LINGERING = "lingering"  # done: still answering late pulls, NACKs and ACKs for a while
    DONE = "done"


class Trigger(enum.Enum):
    FLEET_IS_NEW = "fleet_is_new"  # connected: no fleet runs yet, or it starts with us
    FLEET_RUNS = "fleet_runs"  # connected: a fleet runs without us
    STATE_INSTALLED = "state_installed"  # joining: the fleet's state and a view with us came
    ROUND_STARTS = "round_starts"  # a view covers our round: compute its gradient
    GRADIENT_READY = "gradient_ready"  # the round's machine starts
    VIEW_RESTARTS_ROUND = "view_restarts_round"  # a newer view for the round under way
    ROUND_FINISHED = "round_finished"
    LAST_ROUND_NEEDS_STATE = "last_round_needs_state"  # the last round fell back: final sync
    FINAL_SYNC_ENDED = "final_sync_ended"
    ROUND_ABANDONED = "round_abandoned"  # the fleet is ahead and its state is here
    LEFT_OUT = "left_out"  # the fleet's view does not list us: join again
    RUN_OVER = "run_over"  # the last round is done: linger
    LINGER_OVER = "linger_over"
    JOIN_GAVE_UP = "join_gave_up"  # taken back after the last round, nobody answered
    DISPLACED = "displaced"  # a newer life of this node runs
    REFUSED = "refused"  # the fleet runs another model: we take no part, ever
    FLEET_FINISHED = "fleet_finished"  # the fleet ran its last round while we were away


class PhaseError(RuntimeError):
    """The core asked for a transition the table does not have."""


P, T = Phase, Trigger
TRANSITIONS: dict[tuple[Phase, Trigger], Phase] = {
    (P.CONNECTING, T.FLEET_IS_NEW): P.WAITING,
    (P.CONNECTING, T.FLEET_RUNS): P.JOINING,
    (P.JOINING, T.STATE_INSTALLED): P.WAITING,
    (P.JOINING, T.JOIN_GAVE_UP): P.DONE,
    (P.WAITING, T.ROUND_STARTS): P.COMPUTING,
    (P.WAITING, T.RUN_OVER): P.LINGERING,
    (P.WAITING, T.LEFT_OUT): P.JOINING,
    (P.COMPUTING, T.GRADIENT_READY): P.RUNNING,
    (P.COMPUTING, T.LEFT_OUT): P.JOINING,
    (P.RUNNING, T.VIEW_RESTARTS_ROUND): P.RUNNING,
    (P.RUNNING, T.ROUND_FINISHED): P.WAITING,
    (P.RUNNING, T.LAST_ROUND_NEEDS_STATE): P.FINAL_SYNC,
    (P.RUNNING, T.ROUND_ABANDONED): P.WAITING,
    (P.RUNNING, T.LEFT_OUT): P.JOINING,
    (P.FINAL_SYNC, T.FINAL_SYNC_ENDED): P.WAITING,
    (P.LINGERING, T.LINGER_OVER): P.DONE,
    **{(phase, T.DISPLACED): P.DONE for phase in Phase if phase is not P.DONE},
    **{(phase, T.REFUSED): P.DONE for phase in Phase if phase is not P.DONE},
    **{(phase, T.FLEET_FINISHED): P.DONE
       for phase in (P.JOINING, P.WAITING, P.COMPUTING, P.RUNNING, P.FINAL_SYNC)},
}
del P, T


def next_phase(phase: Phase, trigger: Trigger) -> Phase:
    try:
        return TRANSITIONS[phase, trigger]
    except KeyError:
        raise PhaseError(f"no transition from {phase.name} on {trigger.name}") from None


class Progress:
    """The phase, the round, the round under way (``current``) and the report held during
    the final sync (``pending_report``); what the steps decide moves them."""

    def __init__(self, *, rounds: int, resumed_round: int | None, round_known_at: float,
                 deadline: float | None) -> None:
        self.rounds = rounds  # the run's last round (0: until stopped)
        self.phase = Phase.CONNECTING
        self.deadline = deadline  # when the phase gives up waiting (None: it does not)
        self.resumed = resumed_round is not None
        self.round = resumed_round or 0
        # A restart before the Will removed us keeps us in the view, and no new view says
        # the fleet's round: the states served are of rounds past our checkpoint's by as
        # many as the fleet ran since it was written.
        self.round_known_at = round_known_at
        self.current: RoundInProgress | None = None
        self.pending_report: RoundReport | None = None  # held during FINAL_SYNC
        self.steady_round: tuple[int, int] | None = None  # (round, epoch) last run cleanly here

    def go(self, trigger: Trigger) -> None:
        """The one place the phase changes: as the transition table says."""
        self.phase = next_phase(self.phase, trigger)

    @property
    def joining(self) -> bool:
        return self.phase is Phase.JOINING

    @property
    def done(self) -> bool:
        """The run's last round is behind us."""
        return self.rounds > 0 and self.round >= self.rounds

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline
