"""Fetching the fleet's state: to join, to catch up when the fleet went on without us, to
resync a model that drifted, and for the final sync after a last round that fell back.

``StateFetch`` runs at most one ``StateTransfer`` (agent/protocol/state_transfer.py) at a time,
keeps the state it fetched until the core installs it, and the fleet's updates of the last
``REPLAY_ROUNDS`` rounds, so that a state that comes a few rounds late is installed with them
applied again. Pure: no IO, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from agent.core.actions import ApplyUpdate, CoreAction
from agent.core.outbox import CoreOutbox
from agent.protocol.allreduce import Note
from agent.protocol.membership import Membership
from agent.protocol.messages import StateDigest
from agent.protocol.notes import REJECTED_STATE, NoteKind
from agent.protocol.state_transfer import STATE_STRIPES, StateTransfer, Vouch, state_digest, vouch
from agent.protocol.wire import Frame

PULL_TRIES_PER_PEER = 2  # then a state transfer is given up (a new one starts when still needed)
# A drift resync's state may come this many rounds late (a loaded host serves 4.9 MB slowly):
# it is installed and the rounds' updates since are applied again. Started afresh every round
# instead, two members that drifted at once never resynced under load (broker restart test).
REPLAY_ROUNDS = 3
# A state transfer given up (no peer answered: they were away, or we were) is tried again
# after this many seconds, doubling up to RETRY_MAX_S: an agent never waits silently for ever.
RETRY_BASE_S = 1.0
RETRY_MAX_S = 16.0
# Announced state digests kept per member (its latest rounds): a fetched state is checked
# against its round's, which must still be kept when a large state arrives many fast rounds
# later; a device announcing many rounds pushes out only its own.
ANNOUNCED_ROUNDS = 64


def _backoff(failures: int) -> float:
    """Seconds before the next try after ``failures`` given-up transfers in a row (the exponent
    is capped: a node cut off for hours counts thousands, and 2.0 ** 1024 overflows)."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2.0 ** min(failures - 1, 32))


def site_first(node: int, site: str, peers: list[int], membership: Membership) -> list[int]:
    """``peers`` to pull the state from, the two lowest live members of our own site with a
    lower id than ours put first: the state crosses a slow uplink once, not once per agent
    of a site back from a cut. Its lowest agent pulls across, the next half across, the
    rest from these two (who answer once they hold it: a pull waits for our round)."""
    if not site:
        return peers
    near = sorted(m for m in membership.live() if m < node and membership.sites.get(m) == site)[:STATE_STRIPES]
    return near + [p for p in peers if p not in near and p != node]


class Retry(NamedTuple):
    """A given-up transfer for ``round`` (known to be the fleet's at ``known_at``), tried
    again at ``at``."""

    at: float
    round: int
    known_at: float


@dataclass(frozen=True)
class HeldState:
    """A fetched state waiting for the fleet to announce its digest (since ``since``)."""

    round: int
    state: np.ndarray
    digest: str
    since: float


class StateFetch:
    def __init__(self, node: int, job: int, membership: Membership, outbox: CoreOutbox, *,
                 timeout: float, size: int | None, chunk_values: int, from_coordinator: bool = False,
                 site: str = "") -> None:
        self.node, self.job, self.membership, self.outbox = node, job, membership, outbox
        self.site = site  # ours: a state is pulled from our site first (``site_first``)
        self.from_coordinator = from_coordinator  # its state alone is the fleet's (ps-async)
        self.timeout, self.size, self.chunk_values = timeout, size, chunk_values
        self.transfer: StateTransfer | None = None
        self.received: tuple[int, np.ndarray] | None = None  # (round, state) fetched
        # round -> (values, learning rate) applied, the last REPLAY_ROUNDS (see ``record``).
        self.applied: dict[int, tuple[np.ndarray, float]] = {}
        self.ahead: dict[int, set[int]] = {}  # round -> members whose frames show it (catch-up)
        self.retry: Retry | None = None
        self.failures = 0  # transfers given up in a row (the backoff)
        # peer -> our round when its state disagreed with the reference's: drifted with us
        # (a broker restart drifts several at once), it is asked last for a while.
        self.disputed: dict[int, int] = {}
        self.digests: dict[int, dict[int, str]] = {}  # member -> round -> its announced state digest
        self.held: HeldState | None = None  # fetched, its digest not announced yet

    def fetch(self, target: int, peers: list[int], now: float, round: int,
              anchor_decides: bool = False, since: float | None = None) -> list[CoreAction]:
        """Pull the fleet's state at the start of round ``target`` (or later) from ``peers``
        in turn (we are at ``round``); the coordinator, when among them, is the reference in
        a dispute. ``since``: when ``target`` was last known to be the fleet's round (None:
        now), which bounds how far past it a state may be labelled."""
        coordinator = self.membership.coordinator()
        if self.from_coordinator and coordinator in peers:
            peers = [coordinator]  # the others' states lag its own (server_holds_the_state)
        self.retry, self.held = None, None
        self.transfer = StateTransfer(self.node, self.job, target, peers, self.timeout, now,
                                      size=self.size, chunk_values=self.chunk_values,
                                      anchor=coordinator if coordinator in peers else None,
                                      anchor_decides=anchor_decides, since=since)
        return self.outbox.run(self.transfer.start(now), round)

    def resync(self, why: str, avoid: set[int], now: float, round: int, started: float) -> list[CoreAction]:
        """Our model differs from the fleet's after round ``round`` (it started at ``started``):
        fetch its state for the next round, first from peers not in ``avoid``."""
        self.outbox.note(NoteKind.DRIFT, None, why)
        avoid = avoid | set(self.disputed)  # kept REPLAY_ROUNDS rounds (forget_before)
        view = self.membership.views.view_for(round)
        peers = self.membership.online_peers(view.members if view is not None else [])
        peers = sorted(peers, key=lambda p: p in avoid)  # stable: the usual order otherwise
        lean_on_coordinator = self.membership.coordinator() not in avoid
        if peers and not self._under_way(lean_on_coordinator, round, started):
            # Two peers a stripe each, as a joiner does (one peer's whole state every round
            # is what a flooder took), but in a dispute the coordinator's model is the
            # fleet's: several members may have drifted at once, and no two peers agree
            # until they took the coordinator's state, which it then serves whole. Not when
            # our link from the coordinator failed this round: its stripe would never come.
            return self.fetch(round + 1, peers, now, round, anchor_decides=lean_on_coordinator)
        return []

    def _under_way(self, lean_on_coordinator: bool, round: int, started: float) -> bool:
        """A resync transfer worth waiting for still: asked for fewer than REPLAY_ROUNDS
        rounds ago, and it moved on in this round (state came, or a dispute was taken to the
        anchor). One that got nothing all round is stuck (an anchor that gave its one stripe
        a round): a fresh pair is asked. So is one that does not lean on the coordinator
        when it could (a catch-up's, started while the broker was away, went on asking pairs
        of drifted peers)."""
        transfer = self.transfer
        return (transfer is not None
                and (transfer.anchor_decides or not lean_on_coordinator)
                and transfer.round + REPLAY_ROUNDS > round
                and transfer.last_progress >= started)

    def fell_behind(self, frame: Frame, now: float, round: int, may_catch_up: bool) -> list[CoreAction]:
        """Frames two rounds ahead of ours: the fleet went on without us (we ran a round to its
        deadline, or hung). Catching up round by round never ends; fetch the fleet's state."""
        self.outbox.counters.rejected["future_round"] += 1
        if not may_catch_up or self.transfer is not None or frame.sender not in self.membership.live():
            return []  # a transfer under way takes any newer state than it asked for
        # One peer's word never makes us give our round up: two members must show it (or
        # the only other one, in a fleet that small).
        witnesses = self.ahead.setdefault(frame.round, set())
        witnesses.add(frame.sender)
        others = self.membership.online_peers(self.membership.live())
        if len(witnesses) < min(2, len(others)):
            return []
        self.outbox.note(NoteKind.BEHIND, frame.sender, f"at round {round}, peer at {frame.round}")
        out = self.outbox.absence(frame.round, round)  # we join again at frame.round + 1
        # Ask for the state of the round AFTER the peers': it is served as that round starts,
        # so we join it in step. Ask the coordinator first, then those who showed the round.
        first = [p for p in (self.membership.coordinator(),) if p is not None and p in others]
        order = list(dict.fromkeys([*first, *sorted(witnesses), *others]))
        order = site_first(self.node, self.site, [p for p in order if p != self.node], self.membership)
        return out + self.fetch(frame.round + 1, order, now, round)

    def on_frame(self, frame: Frame, now: float, round: int) -> list[CoreAction]:
        """A MODEL frame (a chunk of a peer's state)."""
        rejected = self.outbox.counters.rejected
        if self.transfer is None:
            # Nothing asked for it (or a late copy of a chunk a transfer no longer needs).
            rejected[NoteKind.STATE_UNASKED] += 1
            return []
        actions = self.transfer.on_frame(frame, now)
        for note in actions:
            if isinstance(note, Note) and note.kind in REJECTED_STATE:
                rejected[note.kind] += 1
                if note.kind is NoteKind.STATE_REJECTED and note.peer is not None:
                    self.disputed[note.peer] = round
        out = self.outbox.run(actions, round)
        if self.transfer.result is not None:
            rnd, state, _ = self.transfer.result
            if not np.all(np.isfinite(state)):
                # A peer's state with NaN or inf (buggy or hostile) is never installed: ask
                # the next peer for it.
                rejected["state_not_finite"] += 1
                return out + self.outbox.run(self.transfer.reject("values not finite", now), round)
            self.held = HeldState(rnd, state, state_digest(state), now)
            out += self._check_held(now, round)
        return out

    def announced(self, digest: StateDigest, now: float, round: int) -> list[CoreAction]:
        """A member's state digest for a round (from its own topic): kept, and a held state
        of that round is checked against it."""
        rounds = self.digests.setdefault(digest.node, {})
        rounds[digest.round] = digest.digest
        while len(rounds) > ANNOUNCED_ROUNDS:
            del rounds[min(rounds)]
        return self._check_held(now, round)

    def _check_held(self, now: float, round: int) -> list[CoreAction]:
        """Install the held state once the coordinator or a majority of the view announced its
        digest for its round; refuse it (the transfer goes on) when they announced another, or
        nobody did for a whole timeout: the stripes' peers alone never make a state the fleet's."""
        held, transfer = self.held, self.transfer
        if held is None or transfer is None:
            return []
        view = self.membership.views.view_for(held.round)
        members = [m for m in (view.members if view is not None else []) if m != self.node]
        coordinator = self.membership.coordinator()
        announced = {n: rounds[held.round] for n, rounds in self.digests.items() if held.round in rounds}
        verdict = vouch(held.digest, announced, members, None if coordinator == self.node else coordinator)
        if verdict is Vouch.UNANNOUNCED and now < held.since + self.timeout:
            return []
        self.held = None
        if verdict is not Vouch.VOUCHED:
            self.outbox.counters.rejected[NoteKind.STATE_UNVOUCHED] += 1
            self.outbox.note(NoteKind.STATE_UNVOUCHED, None, f"round {held.round}: {verdict.value}")
            return self.outbox.run(transfer.reject(f"digest {verdict.value} for round {held.round}", now), round)
        self.transfer, self.failures = None, 0
        if held.round >= round or all(r in self.applied for r in range(held.round, round)):
            self.received = (held.round, held.state)
        return []

    def tick(self, now: float, round: int, joining: bool = False) -> list[CoreAction]:
        transfer = self.transfer
        if transfer is None:
            return self._retry(now, round, joining)
        if self.held is not None:
            return self._check_held(now, round)
        if (wake := transfer.next_timer()) is None or now < wake:
            return []
        if transfer.attempts >= PULL_TRIES_PER_PEER * len(transfer.peers):
            self.failures += 1
            delay = _backoff(self.failures)
            self.outbox.note(NoteKind.STATE_PULL_FAILED, transfer.peer,
                             f"round {transfer.round}: no answer, trying again in {delay:g} s")
            self.transfer, self.retry = None, Retry(now + delay, transfer.round, transfer.round_known_at)
            return []
        return self.outbox.run(transfer.on_timer(now), round)

    def _retry(self, now: float, round: int, joining: bool) -> list[CoreAction]:
        """A given-up transfer, once its backoff is over: still needed (we join, or the state
        was of a round ahead of ours), from the peers live now; none live: back off again."""
        if self.retry is None or now < self.retry.at:
            return []
        target = self.retry.round
        if not joining and target <= round:
            self.retry = None  # caught up meanwhile
            return []
        peers = [p for p in self.membership.state_holders() if p != self.node]
        if not peers:
            self.failures += 1
            self.retry = self.retry._replace(at=now + _backoff(self.failures))
            return []
        self.outbox.note(NoteKind.STATE_PULL, None, f"again (try {self.failures + 1}) for round {max(target, round)}")
        since = self.retry.known_at if target >= round else None
        return self.fetch(max(target, round), peers, now, round, since=since)

    def next_timer(self) -> float | None:
        """When ``tick`` has something to do (None: nothing pending)."""
        if self.held is not None:
            return self.held.since + self.timeout
        if self.transfer is not None:
            return self.transfer.next_timer()
        return None if self.retry is None else self.retry.at

    def retry_now(self, now: float, round: int) -> list[CoreAction]:
        """What was asked or sent while the connection was down is lost: ask again now."""
        return [] if self.transfer is None else self.outbox.run(self.transfer.retry_now(now), round)

    def take(self, at_least: int) -> tuple[int, np.ndarray] | None:
        """The state fetched, when it is of round ``at_least`` or later (then it is handed over)."""
        if self.received is None or self.received[0] < at_least:
            return None
        received, self.received = self.received, None
        return received

    def record(self, round: int, values: np.ndarray, rate: float, fleets: bool) -> None:
        """Round ``round``'s update was applied; ``fleets``: it is the fleet's own (kept for a
        replay). Only the fleet's update is replayed on its state: a fallback of ours to local
        values (a one-way cut may make one every round) replayed on it made us drift again."""
        self.applied = {r: u for r, u in self.applied.items() if round - REPLAY_ROUNDS < r < round}
        if fleets:
            self.applied[round] = (values, rate)

    def replay(self, since: int, round: int) -> list[ApplyUpdate]:
        """The fleet's updates of the rounds from ``since`` up to (not with) ``round``."""
        return [ApplyUpdate(r, *self.applied[r]) for r in range(since, round)]

    def forget_before(self, round: int) -> None:
        self.ahead = {r: s for r, s in self.ahead.items() if r > round}
        self.disputed = {p: r for p, r in self.disputed.items() if r + REPLAY_ROUNDS > round}
