"""Where the parts of an agent core put what they decide: frames out, notes for the round's
report, and the reports of silence a round machine's findings call for."""

from __future__ import annotations

from collections.abc import Sequence

from agent.core.actions import CoreAction, Publish
from agent.core.report import Counters
from agent.core.suspicion import SuspicionBook
from agent.protocol.allreduce import Fanout, Note, Send, frame_size
from agent.protocol.keys import MemberKeys
from agent.protocol.membership import PublishView
from agent.protocol.membership.evidence import seal
from agent.protocol.messages import Suspect
from agent.protocol.notes import NoteKind
from agent.protocol.wire import Frame


class CoreOutbox:
    def __init__(self, node: int, counters: Counters, book: SuspicionBook, keys: MemberKeys | None = None) -> None:
        self.node, self.counters, self.book = node, counters, book
        self.keys = keys  # our device key signs every suspicion and view we publish
        self.notes: list[Note] = []

    def note(self, kind: NoteKind, peer: int | None, detail: str = "") -> None:
        self.notes.append(Note(kind, peer, detail))

    def take_notes(self) -> list[Note]:
        notes, self.notes = self.notes, []
        return notes

    def run(self, actions: Sequence[Send | Fanout | Note], round: int) -> list[CoreAction]:
        """A round machine's (or a state transfer's) actions: notes are kept for the report,
        frames go out, and a peer found silent is reported to the fleet (once per round).

        The silence is the one note with a consequence beyond the report; the round machines
        (agent/protocol/) say it as ``NoteKind.SILENT``."""
        out: list[CoreAction] = []
        for action in actions:
            if isinstance(action, Send):
                out.append(self.frame(action.dst, action.frame))
            elif isinstance(action, Fanout):
                self.counters.bytes_sent += frame_size(action.frame)
                out.append(Publish.fanout(self.node, action.frame))
            else:
                self.notes.append(action)
                if action.kind == NoteKind.SILENT and action.peer is not None:
                    out += self.silent(action.peer, round)
        return out

    def frame(self, dst: int, frame: Frame) -> Publish:
        self.counters.bytes_sent += frame_size(frame)
        return Publish.frame_to(self.node, dst, frame)

    def views(self, actions: Sequence[PublishView]) -> list[CoreAction]:
        """The membership's views to publish, as this node (the coordinator)."""
        keys = self.keys
        return [Publish.view_by(self.node, a.view if keys is None else seal(keys, a.view)) for a in actions]

    def silent(self, peer: int, round: int) -> list[CoreAction]:
        """``peer`` is silent to us in ``round``: our report, once per peer and round."""
        report = self.book.silent(peer, round)
        return [self.suspect(report)] if report is not None else []

    def absence(self, through: int, round: int) -> list[CoreAction]:
        """We take no part in the rounds up to ``through`` that list us: tell the fleet."""
        report = self.book.absence(through, round)
        return [self.suspect(report)] if report is not None else []

    def suspect(self, report: Suspect) -> Publish:
        return Publish.suspect(report if self.keys is None else seal(self.keys, report))
