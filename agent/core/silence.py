"""Reports of silence into an agent core: a member's report that a peer is silent (weighed by
the membership, refuted at once when it is about us), a member's report that it takes no part
in some rounds, and the verdicts the fleet reached that the round machines must act on."""

from __future__ import annotations

from functools import partial

from agent.core.actions import CoreAction
from agent.core.parts import CoreParts
from agent.core.progress import Phase, Progress
from agent.core.steps import Steps
from agent.core.suspicion import first_report_at
from agent.protocol.allreduce import Fanout, Note, RoundMachine, Send
from agent.protocol.membership.evidence import co_signs
from agent.protocol.messages import Suspect
from agent.protocol.notes import NoteKind


class SilenceReports:
    def __init__(self, parts: CoreParts, progress: Progress, steps: Steps) -> None:
        self.parts, self.progress, self.steps = parts, progress, steps

    def suspect(self, report: Suspect, now: float) -> list[CoreAction]:
        """A member reports a peer silent. Unrefuted for the grace, the report excuses the
        peer in that round; with enough witnesses the fleet routes around it at once, in
        every round machine still running, and the coordinator drops it."""
        parts = self.parts
        if report.is_self_report:
            return self._absent(report.node, report.round, now)
        if (why := parts.membership.witnesses.judge(report, parts.membership.round)) is not None:
            parts.counters.rejected[why] += 1
            return []
        out: list[CoreAction] = parts.outbox.views(parts.membership.on_suspect(report, now))
        if report.peer == parts.node:
            out += self._answer(report)
        return out + self.verdicts(now) + self.steps.advance(now)

    def _answer(self, report: Suspect) -> list[CoreAction]:
        """A report about us: we are alive, so refute it; absent from its round, say that too."""
        book, phase, round = self.parts.book, self.progress.phase, self.progress.round
        out: list[CoreAction] = []
        if phase == Phase.JOINING:
            # Joining, we run no round yet: nobody should wait for us in a view that lists us.
            out += self.parts.outbox.absence(max(report.round, round), round)
        elif book.absent_in(report.round):
            # We take no part in that round (alive, catching up): say so again (that report
            # may have been lost), and refute the suspicion below all the same.
            out.append(self.parts.outbox.suspect(book.absence_again()))
        if phase not in (Phase.CONNECTING, Phase.DONE) and book.refute_once(report.node, report.round):
            # We are not silent (cut links around us, a slow moment, or rejoining): say so at
            # once, also while lingering after our last round (the others may still be in it:
            # an unrefuted root there ends it for everybody). Membership ignores an "online"
            # from a node far behind the fleet.
            out.append(self.steps.my_status())
        return out

    def refused(self, now: float) -> list[CoreAction]:
        """A message was refused or was not ours. Many refused (a flood on our link, counted
        by the inbox) delay or crowd out the reports about us: our status refutes them before
        they come."""
        total = sum(self.parts.counters.rejected.values())
        if not self.parts.book.refused(total, now) or self.progress.phase in (Phase.CONNECTING, Phase.DONE):
            return []
        return [self.steps.my_status()]

    def _absent(self, peer: int, through: int, now: float) -> list[CoreAction]:
        """``peer`` takes no part in the rounds up to ``through`` (its self-report): route
        around it there at once, as for a Will, instead of waiting a timeout and a grace for
        a node that is alive (and would refute a suspicion) but not in those rounds."""
        if not self.parts.book.peer_absent(peer, through):
            return []
        self.parts.outbox.note(NoteKind.ABSENT, peer, f"takes no part in rounds up to {through}")
        return self.parts.rounds.absent(peer, through, now) + self.steps.advance(now)

    def verdicts(self, now: float) -> list[CoreAction]:
        """Reports unrefuted for the grace excuse their peer in their round; peers the
        fleet's witnesses found silent are routed around in every machine."""
        parts = self.parts
        out: list[CoreAction] = []
        for peer, rnd in parts.book.to_excuse(parts.membership.witnesses.unrefuted(now), parts.rounds.machines):
            out += parts.rounds.excuse(rnd, peer, now, first_report_at(parts.membership.witnesses.reports, peer))
        for peer in parts.book.newly_suspected(parts.membership.witnesses.suspected()):
            parts.outbox.note(NoteKind.SUSPECTED, peer, "silent by the fleet's witnesses")
            out += parts.rounds.each(partial(_peer_down, peer=peer, now=now))
            if parts.config.keys is not None:
                parts.book.to_co_sign.add(peer)
        return out + self._co_sign(now)

    def _co_sign(self, now: float) -> list[CoreAction]:
        """Our signed word that a suspected peer is silent, once we heard nothing from it for
        a round deadline ourselves: what the coordinator's certificate to drop it is made of."""
        parts, membership = self.parts, self.parts.membership
        deadline = parts.config.allreduce.round_deadline
        due = parts.book.co_sign_due(membership.witnesses.suspected(),
                                     lambda p: co_signs(membership.evidence.quiet_for(p, now), deadline))
        return [a for peer in due for a in parts.outbox.silent(peer, membership.round)]


def _peer_down(machine: RoundMachine, *, peer: int, now: float) -> list[Send | Fanout | Note]:
    return machine.peer_down(peer, now)
