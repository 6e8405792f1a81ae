"""The round machines in flight: the current round's and the finished ones that still answer
late ACKs, NACKs and pulls, keyed by round number, with the bounded buffer of frames of rounds
not started yet. What concerns a peer (its Will, its absence, the fleet's verdict on it, its
busy link) reaches every machine through here, and what the machines answer goes out through
the core's outbox."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import replace

from agent.core.actions import CoreAction
from agent.core.outbox import CoreOutbox
from agent.core.wills import RootGrace
from agent.protocol.allreduce import Algorithm, Fanout, Note, RoundMachine, Send
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.membership import view_root
from agent.protocol.messages import View
from agent.protocol.notes import NoteKind
from agent.protocol.wire import Frame, Kind

MAX_BUFFERED_FRAMES = 4096
# A finished round's machine answers late ACKs, NACKs and pulls until this many rounds later.
ANSWERING_ROUNDS = 1

# A drop of our broker connection this short is our link flapping (the broker stayed); a longer
# one may be the broker's own restart (paho reconnects in 20-140 ms here; a restart takes secs).
FLAP_MAX_AWAY = 1.0
# After a longer drop, for this long neither the round's unACKed units go again nor does a new
# round start: if only our broker was away (a site broker's restart) the fleet went on without
# us, and the view that says so comes in moments. Sent at once, a site's stale round (~16 MB)
# went up its uplink, and its joining statuses waited 0.3-2 s behind it in the bridge.
ABSENCE_SETTLE_S = 0.3


class Recovery(enum.Enum):
    """What a round's machine does as it starts after our connection came back."""

    RECONNECTED = "reconnected"  # the drop came between rounds: its children may have gone around us
    ASK_RESULT = "ask_result"  # a short drop within the round before: the fleet may have gone on


MachineCall = Callable[[RoundMachine], list[Send | Fanout | Note]]


class Rounds:
    def __init__(self, node: int, algorithm: Algorithm, outbox: CoreOutbox) -> None:
        self.outbox = outbox
        self.machines: dict[int, RoundMachine] = {}
        self.future: list[Frame] = []
        self.node = node
        self.grace = RootGrace(node, algorithm)
        self.recovery: tuple[int, Recovery] | None = None  # for that round's start (``reconnected``)
        self.asked_went_on = -1  # the last round we asked for the result the fleet went on with
        self.settle_until = -1e9  # back from a long absence: no resend, no round start before
        self.held_away: float | None = None  # the absence whose resends wait for settle_until

    def get(self, round: int) -> RoundMachine | None:
        return self.machines.get(round)

    def each(self, call: MachineCall, rounds: Iterable[int] | None = None) -> list[CoreAction]:
        """``call`` on every machine (of ``rounds``), in round order of creation."""
        out: list[CoreAction] = []
        for rnd, machine in list(self.machines.items()):
            if rounds is None or rnd in rounds:
                out += self.outbox.run(call(machine), rnd)
        return out

    def excuse(self, round: int, peer: int, now: float, reported: float | None) -> list[CoreAction]:
        """The fleet excused ``peer`` in ``round`` (its first report came at ``reported``)."""
        machine = self.machines[round]
        if isinstance(machine, FtTreeRound):  # it watches the nodes under it from the report on
            return self.outbox.run(machine.excuse(peer, now, reported), round)
        return self.outbox.run(machine.excuse(peer, now), round)

    def deadlines(self) -> list[float]:
        times = [t for m in self.machines.values() if (t := m.next_timer()) is not None]
        held = [self.settle_until] if self.held_away is not None else []
        return times + held + self.grace.deadlines(self.machines)

    def settling(self, now: float) -> bool:
        """Back from a long absence a moment ago: no round starts yet (ABSENCE_SETTLE_S)."""
        return now < self.settle_until

    def timers(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        if self.held_away is not None and not self.settling(now):
            away, self.held_away = self.held_away, None
            # The machines still running: a view that left us out has ended ours meanwhile.
            running = [rnd for rnd, machine in self.machines.items() if machine.result is None]
            out += self.each(lambda m: m.reconnected(now, away), running)
        for rnd, machine in list(self.machines.items()):
            if (wake := machine.next_timer()) is not None and now >= wake:
                out += self.outbox.run(machine.on_timer(now), rnd)
        for rnd, machine in self.grace.end(self.machines, lambda m: now >= self.grace.ends_at(m)):
            out += self.outbox.run(machine.peer_down(machine.tree.root, now), rnd)
        return out

    def start(self, round: int, machine: RoundMachine, away: list[tuple[int, bool]],
              now: float) -> list[CoreAction]:
        """Round ``round``'s machine starts; nobody waits for the peers ``away`` (down, or
        absent from the round: then False beside it) except a root whose Will came a moment
        ago."""
        self.machines[round] = machine
        out: list[CoreAction] = []
        for peer, not_absent in away:
            if not_absent and self.grace.recent_will(peer, now) and self.grace.grants(machine, peer):
                self.grace.rounds.add(round)  # its Will came a moment ago
                out += self.outbox.run(machine.peer_away(peer, now), round)
            else:
                out += self.outbox.run(machine.peer_down(peer, now), round)  # nobody waits for it
        out += self.outbox.run(machine.start(now), round)
        for frame in self._take_future(round):
            out += self.outbox.run(machine.on_frame(frame, now), round)
        recovery, self.recovery = self.recovery, None
        if recovery == (round, Recovery.RECONNECTED) and machine.tree.root != self.node:
            # Not the root: it cannot end a round the others may have gone on with. Our
            # children saw our Will: one that was ready sent around us, and a whole wait for
            # it kept the root waiting for our subtree (1.5-2.5 s rounds of a flapping inner
            # node). went_on waits for them only as long as their first frame usually takes
            # and asks those that sent to us while we were away (a NACK that a child which
            # has not started the round drops: it sent nothing of it).
            out += self.outbox.run(machine.reconnected(now), round)
            out += self.outbox.run(machine.went_on(now), round)
        elif recovery == (round, Recovery.ASK_RESULT):
            out += self.outbox.run(machine.went_on(now), round)
        return out

    def reconnected(self, round: int, away: float, now: float) -> list[CoreAction]:
        """Our broker connection is back after ``away`` seconds; we are at ``round``."""
        running = [rnd for rnd, machine in self.machines.items() if machine.result is None]
        # A short drop is our connection flapping: the broker stayed, and the peers routed
        # around us on our Will at once. After a long one the broker itself may have been
        # away (restarted: everybody was), and the round under way ends by its deadline.
        flapped = away <= FLAP_MAX_AWAY
        out: list[CoreAction] = []
        if flapped:
            out = self.each(lambda m: m.reconnected(now, away) + m.went_on(now), running)
        else:
            self.settle_until = now + ABSENCE_SETTLE_S
            self.held_away = away if running else None
        # Between rounds: the peers may run the next one without us (our Will), so that
        # round's machine recovers as it starts (see ``start``). After a drop within a
        # round they may have started the next one while we were away: its machine asks its
        # parent for the result as it starts (answered once: free when it was not needed).
        if round not in running:
            self.recovery = (round, Recovery.RECONNECTED)
        else:
            self.recovery = (round + 1, Recovery.ASK_RESULT) if flapped else None
        return out

    def fleet_went_on(self, frame: Frame, round: int, view: View | None, now: float) -> list[CoreAction]:
        """A member's contribution to the next round while ours (of ``view``) still waits: it
        has our round's result, and not from us, so the fleet ended the round around us (our
        Will came while the connection was down; the round started before we were back). Ask
        for the result now, once a round, instead of waiting a whole wait for children that
        will not send this round again, and keeping the fleet's next round waiting for us."""
        machine = self.machines.get(round)
        if (machine is None or machine.result is not None or self.asked_went_on >= round
                or not self._shows_fleet_went_on(frame, round, view)):
            return []
        self.asked_went_on = round
        self.outbox.note(NoteKind.BEHIND, frame.sender, f"in round {frame.round}: asking for our round's result")
        return self.outbox.run(machine.went_on(now), round)

    def _shows_fleet_went_on(self, frame: Frame, round: int, view: View | None) -> bool:
        """A member's reduce data of the round after ours, and we are not our round's root
        (nobody else can end it)."""
        return (frame.round == round + 1 and frame.kind == Kind.DATA and not frame.is_broadcast
                and view is not None and frame.sender in view.members and view_root(view) != self.node)

    def will(self, peer: int, incarnation: int, now: float) -> list[CoreAction]:
        """The broker's Last Will: no machine needs to wait a timeout for this peer; but
        nobody can average a round without its root: that one waits a moment for it."""
        self.grace.will_came(peer, now, incarnation)
        out: list[CoreAction] = []
        for rnd, machine in list(self.machines.items()):
            if self.grace.grants(machine, peer):
                self.grace.rounds.add(rnd)
                out += self.outbox.run(machine.peer_away(peer, now), rnd)
            else:
                out += self.outbox.run(machine.peer_down(peer, now), rnd)
        return out

    def root_back(self, peer: int, incarnation: int, now: float) -> list[CoreAction]:
        """The root of a round that waits out its Will is online again: the same life (its
        connection dropped) goes on with the round; a new one (restarted) has lost it."""
        same_life = self.grace.same_life(peer, incarnation)
        out: list[CoreAction] = []
        for rnd, machine in self.grace.end(self.machines, lambda m: m.tree.root == peer):
            out += self.outbox.run(machine.peer_back(peer, now) if same_life
                                   else machine.peer_down(peer, now), rnd)
        return out

    def absent(self, peer: int, through: int, now: float) -> list[CoreAction]:
        """``peer`` takes no part in the rounds up to ``through``: nobody waits for it there."""
        unfinished = [rnd for rnd, m in self.machines.items() if rnd <= through and m.result is None]
        return self.each(lambda m: m.peer_down(peer, now), unfinished)

    def progress(self, frame: Frame, now: float) -> list[CoreAction]:
        """A busy link of a peer still in another round (the limit came while it finished
        the last one): what we sent it in ours is queued behind, not lost."""
        out: list[CoreAction] = []
        for rnd, machine in list(self.machines.items()):
            out += self.outbox.run(machine.on_frame(replace(frame, round=rnd), now), rnd)
        return out

    def buffer(self, frame: Frame) -> bool:
        """Keep a frame of a round not started yet; False: the buffer is full."""
        if len(self.future) >= MAX_BUFFERED_FRAMES:
            return False
        self.future.append(frame)
        return True

    def skip_to(self, round: int) -> None:
        """We go on at ``round`` (a state of it came): frames of rounds before go."""
        self.future = [f for f in self.future if f.round >= round]

    def forget_before(self, round: int) -> None:
        """Round ``round`` starts: machines older than the last finished round have nothing
        left to answer."""
        for r in [r for r in self.machines if r < round - ANSWERING_ROUNDS]:
            del self.machines[r]

    def _take_future(self, round: int) -> list[Frame]:
        now_round = [f for f in self.future if f.round == round]
        self.future = [f for f in self.future if f.round > round]
        return now_round
