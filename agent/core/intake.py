"""Frames into an agent core: a link frame (or a round root's fan-out) goes to the round
machine of its round, a state transfer, the state server, or the buffer of rounds not started
yet; and a peer's large frame still arriving holds the verdicts on silence."""

from __future__ import annotations

from agent.core.actions import CoreAction
from agent.core.inbox import LinkFrame
from agent.core.parts import CoreParts
from agent.core.progress import Progress
from agent.core.steps import Steps
from agent.protocol.allreduce import take_refused
from agent.protocol.wire import Flag, Frame, Kind, RejectReason

# A frame this many rounds ahead of ours means the fleet went on without us.
FUTURE_ROUNDS = 2


def _asks_for_what_we_sent(frame: Frame) -> bool:
    """A NACK asks for units we sent (not a FINAL one: that says a round has no result)."""
    return frame.kind == Kind.NACK and not frame.flags & Flag.FINAL


class FrameIntake:
    def __init__(self, parts: CoreParts, progress: Progress, steps: Steps) -> None:
        self.parts, self.progress, self.steps = parts, progress, steps

    def link_frame(self, read: LinkFrame, now: float) -> list[CoreAction]:
        parts = self.parts
        if read.fanned and parts.chunks.broadcast_in(parts.membership.views.view_for(read.frame.round)) != "fanout":
            # A round whose result is relayed down the tree takes none from a fan-out.
            parts.counters.rejected["fanout_in_tree_round"] += 1
            return []
        return self.frame(read.frame, now)

    def frame(self, frame: Frame, now: float) -> list[CoreAction]:
        parts, round = self.parts, self.progress.round
        out: list[CoreAction] = []
        machine = parts.rounds.get(frame.round)
        parts.membership.evidence.heard_from(frame.sender, now)  # not silent to us (evidence.co_signs)
        progress = frame.kind == Kind.PROBE and bool(frame.flags & Flag.PROGRESS)
        if progress:
            parts.membership.witnesses.peer_busy(frame.sender, now)  # a report about it waits behind that
        if frame.kind == Kind.MODEL_PULL:
            parts.server.asked(frame)
            out += self.steps.serve_pulls()
        elif frame.kind == Kind.MODEL:
            out += parts.fetch.on_frame(frame, now, round)
        elif machine is not None:
            out += parts.outbox.run(machine.on_frame(frame, now), frame.round)
            parts.counters.rejected.update(take_refused(machine.stats))
        elif progress:
            out += parts.rounds.progress(frame, now)
        elif frame.round >= round + FUTURE_ROUNDS:
            out += parts.fetch.fell_behind(frame, now, round, not (self.progress.joining or self.progress.done))
        elif frame.round >= round and _asks_for_what_we_sent(frame):
            pass  # a round we have not started: we sent nothing of it (see Steps.start_machine)
        elif frame.round >= round:
            if not parts.rounds.buffer(frame):
                parts.counters.rejected["buffer_full"] += 1
            current = self.progress.current
            out += parts.rounds.fleet_went_on(frame, round, current.view if current else None, now)
        else:
            parts.counters.rejected[RejectReason.STALE_ROUND.value] += 1
            probe = parts.server.hint(frame, round, self.progress.current is not None)
            out += [parts.outbox.frame(frame.sender, probe)] if probe is not None else []
        return out + self.steps.advance(now)

    def busy_link(self, sender: int | None, now: float) -> list[CoreAction]:
        """A large message from ``sender`` is still arriving, piece by piece (our downlink is
        slow), or (None) what we published is still waiting to leave (our uplink is): the
        rounds under way hold their verdicts on silence (issue 19); the last round's
        broadcast may still drain."""
        self.parts.membership.witnesses.links_busy(now)
        return self.parts.rounds.each(lambda m: m.arriving(sender, now))
