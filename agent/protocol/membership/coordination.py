"""Membership: who takes part in which round, without a consensus protocol.

Every agent keeps a retained ``online`` (or ``joining``) status with an ``offline`` Last Will,
so the broker announces crashes. Statuses and Wills carry the agent's incarnation, which grows
across restarts of the same id: a status of an older life (a late Will, a stale retained
status) is ignored, so a restarted agent is never mistaken for its dead predecessor.

The coordinator, the lowest live id of the newest view (an online node outside it only when no
member is left), publishes a retained ``View(epoch + 1, members, arity, coordinator,
from_round)`` when the live set differs from the newest view (quorum.py says from which round).
While a published view has not taken effect yet, a further change replaces it (same
``from_round``) as long as nobody can have reached its first round, else it is a view of its own
from two rounds ahead: a group healed together comes back in one view, and ``from_round`` never
runs ahead of the fleet. A node that went offline is taken back only after ``STABLE_ROUNDS``: a
burst of flaps is one change.

A suspected node (witnesses.py) is treated as down (like a Will): it never coordinates, the
next view leaves it out (from the next round when it was the root, otherwise two rounds ahead),
and while it is still in the current view the round machines route around it.

Its parts, each with its own state: ``views`` (views.py: the views taken and held),
``witnesses`` (witnesses.py: reports of silence and the verdict), ``admission`` (admission.py:
one model per fleet, new lives). The first view is first_view.py's; quorum.py's the quorum.
Pure: statuses, views and ``now`` in, views to publish out.
"""

from __future__ import annotations

from dataclasses import replace

from agent.protocol.keys import MemberKeys
from agent.protocol.membership.admission import Admission, ModelIdentity
from agent.protocol.membership.evidence import Certificate, Evidence, certified, evidence_of
from agent.protocol.membership.first_view import FirstView, StartupGate, first_view
from agent.protocol.membership.quorum import (
    LEAD_ROUNDS,
    MassDownHold,
    first_round,
    front,
    has_quorum,
)
from agent.protocol.membership.statuses import LIVE_STATES, fleet_finished, sites_of, speaks_at
from agent.protocol.membership.views import MAX_EPOCH_STEP, PublishView, Tuning, ViewBook
from agent.protocol.membership.witnesses import Witnesses
from agent.protocol.messages import Status, Suspect, View
from agent.protocol.wire import RejectReason

STABLE_ROUNDS = 2  # a node that went offline is taken back once it stayed up this many rounds
# ... unless the view had left it out before its Will came, and no Will of it came within this
# many rounds before (a flapping connection's Wills come rounds apart at most): back at once.
FLAP_WINDOW_ROUNDS = 8
# A view that removes a member is believed when we saw that member go offline, or saw it
# reported silent, within this many rounds (our own evidence, not the coordinator's word).
EVIDENCE_ROUNDS = 8


class Membership:
    def __init__(self, node: int, arity: int = 2, initial: View | None = None,
                 gate: StartupGate | None = None, grace: float = 0.0,
                 offline_settle: float = 0.0, identity: ModelIdentity | None = None,
                 root_finishes_first: bool = False, keys: MemberKeys | None = None) -> None:
        self.node = node
        # With the job's keys, a view drops a member for silence only with a certificate of
        # signed suspicions (evidence.py); without them, on our own evidence as before.
        self.evidence = Evidence(keys)
        self.arity = arity
        # A round's result leaves from the view's root and the next round starts on it (``front``).
        self.root_finishes_first = root_finishes_first
        self.admission = Admission(identity)
        self.views = ViewBook(initial)
        self.witnesses = Witnesses(node, grace)
        self.gate = gate or StartupGate()
        self.states: dict[int, str] = {}
        self.sites: dict[int, str] = {}  # node -> the site its latest live status names
        self.incarnations: dict[int, int] = {}
        self.said_round: dict[int, int] = {}  # node -> the round its latest status names
        self.round = 0
        self.now = self.gate.started_at
        # A Will counts for views this long after it came: a broker going down publishes every
        # client's Will just before our own connection drops (which then holds all decisions).
        self.offline_settle = offline_settle
        self.went_down: dict[int, int] = {}  # node -> our round when it last went offline
        # Nodes whose last Will came when the newest view had left them out already, with
        # no Will of theirs for FLAP_WINDOW_ROUNDS before (see _coordinate): the end of a
        # connection the fleet had given up on, not a flap.
        self.will_when_out: set[int] = set()
        # Order of what we heard (statuses and views), to tell "spoke after it was dropped".
        self.seen = 0
        self.spoke_at: dict[int, int] = {}  # node -> `seen` at its last online/joining status
        self.offline_at: dict[int, float] = {}  # node -> when its offline status came
        self.hold_until = 0.0  # no view and no eviction before this (the picture is partial)
        self.mass_down = MassDownHold()
        self.cut_at = -1  # `seen` when we were last cut off: our own Will, our site's bridge down

    # ------------------------------------------------------------------ inputs

    def on_status(self, status: Status, now: float) -> list[PublishView]:
        self.now = now
        if status.incarnation < self.incarnations.get(status.node, 0):
            return []  # an older life of that node (a late Will, a stale retained status)
        members = self.views.newest.members if self.views.kept else []
        self.admission.new_life(status, self.incarnations.get(status.node), members)
        self.incarnations[status.node] = status.incarnation
        self.said_round[status.node] = status.round
        if status.state == "offline":
            self._went_offline(status.node, now)
        self.states[status.node] = status.state
        if status.state != "offline":
            self.sites[status.node] = status.site
            self.evidence.heard_from(status.node, now)
        if (unconfirmed := self.admission.heard(status)) is not None:
            self.on_view(unconfirmed)
        self.seen += 1
        present = speaks_at(status, self.round)
        if status.state != "offline" and (present or status.node not in self.views.removed_at):
            self.spoke_at[status.node] = self.seen  # a dropped node far behind returns by rejoining
        if status.node != self.node and present:
            # It speaks again, at the fleet's round (a node that resumes far behind is not
            # back until it rejoins through the join path, which it then announces). Its Will
            # is not speaking: a suspected node stays suspected while the Will settles.
            self.witnesses.spoke(status.node)
        self._retry_pending_views()
        return self._coordinate()

    def _went_offline(self, node: int, now: float) -> None:
        last_will = self.went_down.get(node)
        if (self.views.kept and node not in self.views.newest.members
                and (last_will is None or self.round - last_will >= FLAP_WINDOW_ROUNDS)):
            self.will_when_out.add(node)
        else:
            self.will_when_out.discard(node)
        self.went_down[node] = self.round
        self.offline_at[node] = now
        if node == self.node:
            self.cut_at = self.seen + 1  # (this status's place in the order, see on_status)

    def on_suspect(self, report: Suspect, now: float) -> list[PublishView]:
        """A member heard nothing from ``report.peer`` for a whole timeout."""
        self.evidence.heard_from(report.node, now)
        if not self.witnesses.record(report, now, self.round):
            return []
        self.evidence.signed.heard(report)
        return self.check(now)

    def _refuted(self, report: Suspect) -> bool:
        """Its suspect spoke after it, as we saw. Not one about us: we answer every report about
        us, a hung node too once it wakes, too late for the fleet, which went on without it."""
        return self.witnesses.refuted.get((report.peer, report.node), -1) >= report.round

    def hold(self, until: float) -> None:
        """Decide nothing until ``until`` (inf: until told otherwise): while the broker is
        away, and right after a reconnect (a restarted broker lost the retained statuses,
        which come back one by one), the picture is partial."""
        self.hold_until = until

    def check(self, now: float) -> list[PublishView]:
        """Reports that stood unrefuted for ``grace`` count (call when time passes)."""
        self.now = now
        if now < self.hold_until:
            return []
        known = set(self.views.newest.members) if self.views.kept else set(self.states)
        self.witnesses.evict(now, self.round, self.states, known)
        self._retry_pending_views()
        return self._coordinate()  # also what a hold kept back

    def offer_view(self, view: View, publisher: int) -> RejectReason | None:
        """A view from ``view/<publisher>`` (the ACL lets each agent write only its own).
        Returns None when taken (or old news), else why not: only the coordinator's view counts
        (one that may become it later waits) and epochs advance by small steps, so one
        agent's forged view cannot split or halt the fleet."""
        if view.coordinator != publisher:
            return RejectReason.VIEW_NOT_ITS_PUBLISHERS
        if not self.views.kept:
            return self._offer_first_view(view, publisher)
        # The fleet reported us silent and went on without us: its new coordinator's view
        # is news to us even though we would still coordinate (we resumed from a hang). Only
        # from the member next in line, though: anyone else's view without us is a forgery.
        taken_out = self._takes_us_out(view)
        if taken_out and (why := self._uncertified(view, self.node)) is not None:
            return why  # one member's word that we are silent (and its view) evicts nobody
        if taken_out and publisher == self._next_in_line() and view.epoch <= self.views.newest.epoch + MAX_EPOCH_STEP:
            self.views.yield_own(view, self.node)
        elif taken_out and publisher != self.coordinator():
            self.views.pending[publisher] = view
            return RejectReason.VIEW_TAKES_US_OUT
        else:
            taken_out = False
        if not self.views.is_news(view):
            return None
        away = self.cut_at > self.views.taken_at
        if self.views.epoch_jumps(view, away):
            return RejectReason.VIEW_EPOCH_JUMP
        if publisher != self.coordinator() and not taken_out:
            # Held, not taken: it counts once its publisher is the coordinator (its
            # predecessor's Will or eviction may still be on the way); counted meanwhile.
            self.views.pending[publisher] = view
            return RejectReason.VIEW_NOT_COORDINATOR
        if not away and (why := self._removals_refused(view)) is not None:
            # Even the coordinator removes only who we saw go offline or reported silent
            # (with keys: whom its certificate proves silent): a compromised one cannot evict
            # healthy members. Held until we see it too. (Cut off ourselves, we saw nothing:
            # the coordinator's word is all there is.)
            self.views.pending[publisher] = view
            return why
        self.on_view(view)
        return None

    def cut_off(self) -> None:
        """The fleet heard nothing of us for a while, as if our Will came: our site's bridge
        went down, or our own broker connection (a restarted site broker publishes none of our
        Wills; the bridge's going down took our whole site out). The fleet's view without us
        drops our site's members, whom we saw not go: held back, a site never rejoined after a
        cut, and after its broker's restart waited out its round's deadline first."""
        self.seen += 1
        self.cut_at = self.seen

    def _takes_us_out(self, view: View) -> bool:
        """``view`` leaves us out, and we were reported silent lately."""
        return self.node not in view.members and self.witnesses.reported_lately(self.node, self.round)

    def _next_in_line(self) -> int | None:
        """Who coordinates once we are out: the lowest live member of the newest view but us
        (an online node outside it when none is left)."""
        gone = {n for n, s in self.states.items() if s != "online"} | self.witnesses.suspected() | {self.node}
        online = {n for n, s in self.states.items() if s == "online"}
        candidates = sorted(set(self.views.newest.members) - gone) or sorted(online - gone)
        return candidates[0] if candidates else None

    def _first_view(self, view: View, publisher: int) -> FirstView:
        return first_view(view, publisher, self.node, self.states, self.witnesses.suspected())

    def _offer_first_view(self, view: View, publisher: int) -> RejectReason | None:
        verdict = self._first_view(view, publisher)
        if verdict is FirstView.TAKE:
            self.on_view(view)
            return None
        if verdict is FirstView.EPOCH_TOO_HIGH:
            return RejectReason.FIRST_VIEW_EPOCH
        self.views.pending[publisher] = view  # taken if its publisher turns out to coordinate
        return RejectReason.FIRST_VIEW_NOT_COORDINATOR if verdict is FirstView.NOT_COORDINATOR else None

    def _retry_pending_views(self) -> None:
        """A view that came before the evidence that made its publisher the coordinator (its
        predecessor's Will, the suspicion) is taken once that evidence is here."""
        pending = self.views.pending
        for publisher, view in sorted(pending.items()):
            if not self.views.kept:
                if self._first_view(view, publisher) is FirstView.TAKE:
                    del pending[publisher]
                    self.on_view(view)
                continue
            if not self.views.is_news(view):
                del pending[publisher]
            elif publisher == self.coordinator() and self._removals_refused(view) is None:
                del pending[publisher]
                self.on_view(view)

    def _removals_refused(self, view: View) -> RejectReason | None:
        """Why ``view`` may not drop the members it drops (None: it may). Every one (but us: a
        fleet that went on without us is news we must take, see offer_view) is one we have our
        own evidence against: offline now, or went offline or was reported silent within
        EVIDENCE_ROUNDS rounds; with keys, a report is no evidence, the view's certificate is,
        and a new coordinator only takes over from a live one with it."""
        removed = set(self.views.newest.members) - set(view.members) - {self.node}
        if self.evidence.keys is None:
            ok = all(self._seen_gone(n) for n in removed)
            return None if ok else RejectReason.VIEW_REMOVAL_UNWITNESSED
        if self._coordinator_changes_unproved(view):
            return RejectReason.VIEW_COORDINATOR_UNCERTIFIED
        for node in sorted(removed):
            if not self._gone_by_its_word(node) and (why := self._uncertified(view, node)) is not None:
                return why
        return None

    def _coordinator_changes_unproved(self, view: View) -> bool:
        """``view`` names another coordinator than the newest view, whose coordinator is still
        online and stays in it, without being the lower id (a member back that coordinates
        by the lowest-id rule)."""
        old = self.views.newest.coordinator
        return (view.coordinator != old and self.states.get(old) == "online" and old in view.members
                and view.coordinator > old)

    def _gone_by_its_word(self, node: int) -> bool:
        """Its own status (a Will, a clean exit; signed) says it went, now or lately, or it runs
        another model, or we never heard of it: no certificate needed."""
        if self.states.get(node) not in LIVE_STATES or node in self.admission.foreign:
            return True
        return node in self.went_down and self.went_down[node] >= self.round - EVIDENCE_ROUNDS

    def _uncertified(self, view: View, node: int) -> RejectReason | None:
        """Why ``view``'s certificate does not drop ``node`` (None: it does, or there are no keys)."""
        if self.evidence.keys is None:
            return None
        verdict = certified(self.evidence.keys, view, node, self.round, self._refuted)
        if verdict is Certificate.CERTIFIED:
            return None
        return RejectReason.VIEW_EVIDENCE_STALE if verdict is Certificate.STALE else RejectReason.VIEW_REMOVAL_UNCERTIFIED

    def _seen_gone(self, node: int) -> bool:
        witnesses = self.witnesses
        if (self.states.get(node) not in LIVE_STATES or node in witnesses.evicted
                or node in self.admission.foreign):
            return True  # offline, another model, or never heard of (the coordinator knows the fleet longer)
        recent = self.round - EVIDENCE_ROUNDS
        return self.went_down.get(node, recent - 1) >= recent or witnesses.reported_in.get(node, recent - 1) >= recent

    def on_view(self, view: View) -> bool:
        """Keep a view if it is newer than every one known; True when it was new. A view of
        another model than ours is never kept (admission.py)."""
        if not self.admission.takes(view) or not self.views.is_news(view):
            return False
        self.seen += 1
        self.views.take(view, self.seen)
        self.admission.new_lives = set()
        return True

    def round_started(self, round: int, now: float) -> list[PublishView]:
        """The node is at ``round``. Idempotent: call it again while waiting for the first
        view, the start-up gate may open by time alone."""
        self.round, self.now = round, now
        self.evidence.signed.forget_before(round)
        return self._coordinate()

    # ------------------------------------------------------------------ queries

    def live(self) -> list[int]:
        """Online or joining, not suspected of being silent, and running our model."""
        out = self.witnesses.suspected() | self.admission.foreign
        return sorted(n for n, s in self.states.items() if s in LIVE_STATES and n not in out)

    def next_check(self) -> float | None:
        """When a pending report's grace ends, or a hold (None: nothing pending)."""
        times = self.witnesses.pending(self.now)
        if self.hold_until > self.now:
            times.append(self.hold_until)
        # The same sum as in _coordinate: the check at this time must find the Will settled
        # (now - t >= settle could round below settle, and nothing woke the coordinator again).
        times += [t + self.offline_settle for n, t in self.offline_at.items()
                  if self.states.get(n) == "offline" and t + self.offline_settle > self.now]
        if (hold_ends := self.mass_down.ends(self.now)) is not None:
            times.append(hold_ends)
        return min(times) if times else None

    def is_down(self, node: int) -> bool:
        """Offline (a Will or a clean exit) or suspected: nobody should wait for it."""
        return self.states.get(node) == "offline" or node in self.witnesses.suspected()

    def finished(self, rounds: int, members: list[int] | tuple[int, ...]) -> bool:
        return fleet_finished(self.node, rounds, members, self.said_round, set(self.states))

    def will_of(self, node: int) -> Status:
        """The offline status the node's Will would publish, for its current life."""
        return Status(node, "offline", round=self.said_round.get(node, 0),
                      incarnation=self.incarnations.get(node, 0))

    def is_online(self, node: int) -> bool:
        return self.states.get(node) == "online"

    def online_peers(self, among: list[int] | tuple[int, ...]) -> list[int]:
        """The online nodes of ``among`` other than this one: who can serve the state."""
        return [n for n in among if n != self.node and self.is_online(n)]

    def state_holders(self) -> list[int]:
        """Who serves a joiner the state: live members of the newest view, else any live node
        (one left out may be cut off, its status still online: its stripe never came)."""
        latest = self.views.latest
        live, members = self.live(), set(latest.members if latest else ())
        return self.online_peers([n for n in live if n in members]) or self.online_peers(live)

    def knows_incarnation(self, node: int, incarnation: int) -> bool:
        return self.incarnations.get(node) == incarnation and node in self.states

    def coordinator(self) -> int | None:
        """The lowest member of the newest view not known to be offline, joining or silent;
        an online node outside the view only when no member is left. So a node that resumes
        after the fleet went on without it defers to the newer view (no split brain), and a
        joiner, which does not know the fleet's round yet, never coordinates."""
        gone = {n for n, s in self.states.items() if s != "online"} | self.witnesses.suspected()
        current = set(self.views.newest.members) if self.views.kept else set()
        online = {n for n, s in self.states.items() if s == "online"}
        candidates = sorted(current - gone) or sorted(online - gone)
        return candidates[0] if candidates else None

    def has_quorum(self, live: list[int] | set[int]) -> bool:
        """Whether a view of ``live`` may follow the newest one: it keeps the quorum of the
        newest view and of the one in effect (quorum.py). A side cut off with fewer never
        forms a fleet of its own: it waits (the core holds its rounds, see
        RoundGate.mostly_down) and rejoins."""
        return has_quorum(live, (self.views.latest, self.views.view_for(self.round)))

    def front(self) -> int:
        """The furthest round a member can have started (quorum.front)."""
        return front(self.round, self.node, self.views.view_for(self.round), self.root_finishes_first)

    # ------------------------------------------------------------------ coordinator

    def _coordinate(self) -> list[PublishView]:
        if self.coordinator() != self.node or self.now < self.hold_until:
            return []
        if not self.views.kept:
            return self._publish_first_view()
        newest = self.views.newest
        # Absence of a status is not news (statuses trickle in at start-up): only an explicit
        # offline or enough witnesses remove a member, only online/joining adds one.
        gone = {n for n, s in self.states.items() if s not in LIVE_STATES
                and self.offline_at.get(n, -1e9) + self.offline_settle <= self.now}
        gone |= self.witnesses.suspected() | self.admission.foreign
        # A connection that flaps is taken back once it stayed up a while, not at every
        # reconnect: a burst of flaps is one removal and one return. Not a node whose Will
        # came while the view had left it out already (cut off, found silent by the
        # witnesses): that Will is its old connection's end, and the node is back the moment
        # it says so. If it flaps on, its next Will finds it in the view again.
        settling = {n for n, r in self.went_down.items()
                    if self.round - r < STABLE_ROUNDS and n not in self.will_when_out}
        # A node the fleet dropped comes back only by speaking after that: its status from
        # before (a hung node's, still retained; no Will comes) is no sign of life. A
        # coordinator that resumed from a hang took such a node back while it was frozen.
        current = set(newest.members)
        returning = {n for n in self.live() if n in current
                     or self.spoke_at.get(n, -1) > self.views.removed_at.get(n, -1)}
        live = sorted((current - gone) | (returning - (settling - current)))
        live = self._certify(live, gone - self.witnesses.suspected())
        unchanged = list(newest.members) == live and not self.admission.new_lives & set(live)
        if unchanged or self.mass_down.holds(newest.members, gone, self.now) or not self.has_quorum(live):
            return []
        first = first_round(self.round, live, gone, newest, self.views.view_for(self.round), self.front())
        if newest.from_round > self.round:
            return self._amend_pending(live, first)
        return self._publish(live, newest.epoch + 1, first)

    def _certify(self, live: list[int], gone_by_word: set[int]) -> list[int]:
        """With keys, the members ``live`` drops for silence alone stay in until a quorum of
        ``live`` signed suspicions about them (kept as their certificate, which every view of
        ours carries while they are out: a member that hung meanwhile learns from our newest
        view alone that it is out); without keys, ``live`` as it is."""
        if self.evidence.keys is None:
            return live
        kept = list(live)
        dropped = set(self.views.newest.members) - set(live) - gone_by_word - {n for n in self.views.newest.members
                                                                              if self._gone_by_its_word(n)}
        for node in sorted(dropped):
            certificate = self.evidence.signed.certificate(node, live, self.round, self._refuted)
            if certificate is None:
                kept.append(node)
            else:
                self.evidence.carried[node] = evidence_of(certificate)
        return sorted(kept)

    def _amend_pending(self, live: list[int], first: int) -> list[PublishView]:
        """The last change has not taken effect yet. While nobody can have reached its first
        round (and it is not too soon for this change), the pending view is replaced (same
        ``from_round``) by one of ``live``: a group healed together gets one view. Else the
        change is a view of its own right after it."""
        newest = self.views.newest
        pending, ahead = newest.from_round, self.front()
        amend = newest.coordinator == self.node and pending > ahead and pending >= first
        return self._publish(live, newest.epoch + 1, pending if amend else max(first, ahead + 1))

    def _publish_first_view(self) -> list[PublishView]:
        live = self.live()
        # A node with another model has come too: the gate waits for nobody more on its account.
        if not self.gate.is_open(len(live) + len(self.admission.foreign), self.now):
            return []
        return self._publish(live, 1, self.round)

    def change_chunks(self, chunk_values: int, broadcast: str | None = None) -> list[PublishView]:
        """As coordinator, cut the vector into chunks of ``chunk_values`` (0: the configured
        size) and send the result as ``broadcast`` says ("": the configured way; None: as the
        newest view does) from ``LEAD_ROUNDS`` on: see ``retune``."""
        broadcast = self.views.newest.broadcast if broadcast is None and self.views.kept else broadcast
        return self.retune(replace(Tuning.of(self.views.latest), chunk_values=chunk_values,
                                   broadcast=broadcast or ""))

    def retune(self, tuning: Tuning) -> list[PublishView]:
        """As coordinator, run the rounds from ``LEAD_ROUNDS`` on as ``tuning`` says: a view with
        the same members. Nothing while a change is still pending (views stay ordered, no
        burst) or when it is the newest view's."""
        if self.coordinator() != self.node or not self.views.kept or self.now < self.hold_until:
            return []
        newest = self.views.newest
        if newest.from_round > self.round or Tuning.of(newest) == tuning:
            return []
        return self._publish(list(newest.members), newest.epoch + 1, self.round + LEAD_ROUNDS, tuning)

    def _publish(self, members: list[int], epoch: int, from_round: int,
                 tuning: Tuning | None = None) -> list[PublishView]:
        # A membership change keeps the tuning of the newest view (a new coordinator decides again).
        tuning, own = tuning or Tuning.of(self.views.latest), self.admission.identity
        view = View(epoch=epoch, members=members, arity=self.arity, coordinator=self.node,
                    from_round=from_round, chunk_values=tuning.chunk_values, broadcast=tuning.broadcast,
                    sync_every=tuning.sync_every, fingerprint=own.fingerprint, model=own.name, params=own.params,
                    sites=sites_of(self.sites, members), evidence=self.evidence.carry(members))
        self.on_view(view)
        return [PublishView(view)]
