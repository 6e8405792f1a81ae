"""Membership: who takes part in which round, without a consensus protocol.

Every agent keeps a retained ``online`` (or ``joining``) status with an ``offline`` Last Will,
so the broker announces crashes. Statuses and Wills carry the agent's incarnation, which grows
across restarts of the same id: a status of an older life (a late Will, a stale retained
status) is ignored, so a restarted agent is never mistaken for its dead predecessor.

The coordinator, the lowest live id of the newest view (an online node outside it only when no
member is left), publishes a retained ``View(epoch + 1, members, arity, coordinator,
from_round)`` when the live set differs from the newest view; ``from_round`` lies two rounds
ahead so the view reaches everybody before it applies. A view that only adds members applies
right after the furthest round a member can have started: under a tree whose root coordinates,
the round after the coordinator's (nobody starts it before the root's result, which leaves
after the view). While a published view has not taken effect yet, a further change replaces
it (same ``from_round``) as long as nobody can have reached its first round, else it is a view
of its own from two rounds ahead: a group healed together comes back in one view, and
``from_round`` never runs ahead of the fleet. A node
that went offline is taken back only after ``STABLE_ROUNDS``: a burst of flaps is one change. Every node uses, in round r,
the newest view (highest epoch) whose ``from_round <= r``, so all members switch trees at the
same round; with none, the newest view it has (never waiting for a view that cannot come).

Silent nodes (frozen, socket still open: no Will comes) are found from the fleet's own
evidence. A node that heard nothing at all from a peer for a whole timeout (a link declared
dead, a silent child, a relay through it unanswered) publishes a ``Suspect`` to every member.
A node that is alive and sees a report about itself refutes it at once by publishing its
status: the broker still hears it, so only its links are slow or cut. A node is *suspected*
when a report about it (from a member, within ``SUSPICION_ROUNDS`` rounds) stood unrefuted
for ``grace`` seconds (``DOWNLINK_BUSY_HOLD`` more while our own links show a backlog at the report: the
refutation may wait behind a large frame, or the suspect's: its PROGRESS): then it is silent to the broker too, frozen or cut off. One witness
is enough because the suspect itself is asked; a lossy or cut link, or cut links all around a
healthy node, are refuted and evict nobody. So that a congested broker (late refutations)
cannot empty the fleet, never more than a minority is suspected within
``EVICTION_WINDOW_ROUNDS`` rounds (one at a time, each against a view already shrunk, it did).
A suspected node is treated as down (like a Will): it never coordinates, the next view leaves it
out (from the next round when it was the root, otherwise two rounds ahead), and while it is
still in the current view the round machines route around it. Suspicion ends when the node
speaks again at the fleet's round, or announces that it rejoins; reports expire after
``SUSPICION_ROUNDS``.

One model per fleet: every status names the agent's model (``ModelIdentity``: fingerprint,
name, parameter count) and the coordinator's view names the fleet's, its own. The coordinator
never admits a node whose fingerprint differs (``admits``): it is not live for views. A node
whose model differs from the view it would take is *refused* (``refusal``): it takes no view
and the driver stops it. Its frames cannot reach the fleet either: the frames' job hash mixes
in the fingerprint (wire.job_hash), so they are rejected as a foreign job. At start-up the
lowest id coordinates, so its model is the fleet's; once a view exists its coordinator is a
member, and a newcomer with a lower id and another model is refused.

Start-up gating: while no view exists at all, the coordinator waits until
``expected_members`` are live or ``join_grace`` seconds have passed, then publishes the first
view for the round it is at (everybody is waiting there). Pure: statuses, views and ``now``
in, views to publish out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from agent.protocol.allreduce import BUSY_AT_REPORT, DOWNLINK_BUSY_HOLD
from agent.protocol.messages import Status, Suspect, View
from agent.protocol.topology import Tree
from agent.protocol.wire import RejectReason

LEAD_ROUNDS = 2  # a new view applies this many rounds after the coordinator's current one
SUSPICION_ROUNDS = 2  # a report counts for the round it names and this many after
SUSPICION_RTTS = 2.0  # a report stands at least this many of the links' round trips (refutation)
STABLE_ROUNDS = 2  # a node that went offline is taken back once it stayed up this many rounds
# ... unless the view had left it out before its Will came, and no Will of it came within this
# many rounds before (a flapping connection's Wills come rounds apart at most): back at once.
FLAP_WINDOW_ROUNDS = 8
MAX_EPOCH_STEP = 4  # a view's epoch is at most this far beyond the newest one known
# A first view's epoch at most (a fleet publishes a few views a round at most: 2^32 is
# centuries of views), leaving the fleet room to count up to the messages' 2^53.
MAX_FIRST_EPOCH = 2**32
# ... unless our own Will came after we took the newest view: cut off, we missed the views the
# fleet published meanwhile (one per change: a long cut is many), and its retained view is the
# one way back. Still bounded: an epoch nobody can follow is refused all the same.
MAX_AWAY_EPOCH_STEP = 1024
# A view that removes a member is believed when we saw that member go offline, or saw it
# reported silent, within this many rounds (our own evidence, not the coordinator's word).
EVIDENCE_ROUNDS = 8
# Evictions by suspicion this many rounds apart count together against the minority bound:
# one at a time, a congested broker's late refutations emptied a 7-agent fleet in 1 s.
EVICTION_WINDOW_ROUNDS = 8
MASS_DOWN_HOLD = 10.0  # s: half the view offline at once is the broker, not crashes: wait
LIVE_STATES = ("online", "joining")
KEPT_VIEWS = 8


def view_root(view: View) -> int:
    """The root of a view's tree: its coordinator, an established member (never a node that
    is still joining), when it is a member; else the lowest member."""
    return view.coordinator if view.coordinator in view.members else view.members[0]


def view_tree(view: View) -> Tree:
    sites = dict(zip(view.members, view.sites, strict=True)) if view.sites else None
    return Tree.of(view.members, view.arity, root=view_root(view), sites=sites)


def sites_of(sites: dict[int, str], members: list[int]) -> list[str]:
    """Each member's site by its statuses; [] when none has one (a site-blind tree)."""
    named = [sites.get(m, "") for m in members]
    return named if any(named) else []


def cut_off(sites: dict[int, str], own: str, bridge: str) -> list[int]:
    """The nodes a down bridge of site ``bridge`` cuts us (at site ``own``) off from: every
    other site's when it is ours, else that site's."""
    if bridge == own:
        return sorted(n for n, s in sites.items() if s != own)
    return sorted(n for n, s in sites.items() if s == bridge)


class StatusSource(enum.Enum):
    """Whom a status speaks for, against the topic it came on (the ACL lets each agent write
    only its own ``status/<id>``, and its Last Will goes there too)."""

    OWN = "own"  # the node its topic names
    FORGED = "forged"  # another node: refused, counted


def speaks_at(status: Status, round: int) -> bool:
    """The status shows its node here now: joining, or online at about ``round``. Not one from
    far behind: a bridge back from a cut resends its site's retained statuses of the cut's
    round (taken back on those, the site stalled the fleet's next round and split it)."""
    return status.state == "joining" or (status.state == "online" and status.round + SUSPICION_ROUNDS >= round)


def status_source(status: Status, topic_node: int) -> StatusSource:
    return StatusSource.OWN if status.node == topic_node else StatusSource.FORGED


class FirstView(enum.Enum):
    """What a node without any view does with one offered (``Membership.first_view``)."""

    TAKE = "take"  # from the coordinator by our own statuses
    WAIT = "wait"  # its publisher is not online here (not heard yet, or gone): held
    NOT_COORDINATOR = "not_coordinator"  # a lower online node coordinates: held, counted
    EPOCH_TOO_HIGH = "epoch_too_high"  # the fleet could never count past it: refused, counted


class SuspicionRound(enum.Enum):
    """Where a report's round lies against ours (``suspicion_round``)."""

    TIMELY = "timely"  # ours, the next, or up to SUSPICION_ROUNDS before ours: weighed
    EXPIRED = "expired"  # older: ignored (a late honest report)
    AHEAD = "ahead"  # beyond the next round: refused, counted


def suspicion_round(report_round: int, our_round: int) -> SuspicionRound:
    """Members run the same round or the next, so a report of silence names one of them. One
    far ahead stood "within SUSPICION_ROUNDS" for ever: repeated, it evicted healthy nodes
    one after another, the coordinator too, and split the fleet."""
    if report_round + SUSPICION_ROUNDS < our_round:
        return SuspicionRound.EXPIRED
    return SuspicionRound.AHEAD if report_round > our_round + 1 else SuspicionRound.TIMELY
def _keeps_quorum(members: list[int], live: list[int] | set[int]) -> bool:
    kept = [m for m in members if m in live]
    return len(kept) * 2 > len(members) or (len(kept) * 2 == len(members) and min(members) in kept)


@dataclass(frozen=True)
class PublishView:
    view: View


@dataclass(frozen=True)
class ModelIdentity:
    """The model an agent trains, as it announces it: ``fingerprint`` (16 hex, over shapes,
    parameter count and initial weights), ``name`` and ``params``; "" when unknown."""

    fingerprint: str = ""
    name: str = ""
    params: int = 0

    @classmethod
    def of_status(cls, status: Status) -> ModelIdentity:
        return cls(status.fingerprint, status.model, status.params)

    @classmethod
    def of_view(cls, view: View) -> ModelIdentity:
        return cls(view.fingerprint, view.model, view.params)

    def describe(self) -> str:
        return f"model {self.name or '?'}, {self.params:,} params"


@dataclass(frozen=True)
class Refusal:
    """This agent's model is not the fleet's: it must not take part (and says why, once)."""

    own: ModelIdentity
    fleet: ModelIdentity
    coordinator: int

    def line(self) -> str:
        return (f"refused: this agent's model fingerprint {self.own.fingerprint or '(none)'} differs "
                f"from the fleet's {self.fleet.fingerprint} ({self.own.describe()} vs "
                f"{self.fleet.describe()}, coordinator node {self.coordinator}); every agent of a "
                f"job must run the same model")


def admits(fleet: ModelIdentity, status: Status) -> bool:
    """Whether a coordinator whose model is ``fleet`` takes the node of ``status`` into its
    views: same fingerprint (a coordinator that does not know its own admits everybody)."""
    return not fleet.fingerprint or status.fingerprint == fleet.fingerprint


def refusal(own: ModelIdentity, view: View, coordinator_model: str | None) -> Refusal | None:
    """The refusal of an agent with model ``own`` by ``view``, whose coordinator's latest live
    status names ``coordinator_model`` (None: not heard). None when the agent may take part:
    same fingerprint, a view that names none, or a view its coordinator no longer stands for
    (a retained view of an earlier run of the job, with another model)."""
    if not view.fingerprint or view.fingerprint == own.fingerprint or coordinator_model != view.fingerprint:
        return None
    return Refusal(own, ModelIdentity.of_view(view), view.coordinator)


@dataclass(frozen=True)
class StartupGate:
    """When the first view may be published: ``expected_members`` live, or ``join_grace``
    seconds after ``started_at``. The default never waits."""

    expected_members: int = 0
    join_grace: float = 0.0
    started_at: float = 0.0

    def is_open(self, live: int, now: float) -> bool:
        return live >= self.expected_members or now - self.started_at >= self.join_grace


class MassDownHold:
    """Half the view gone at once: a broker shutting down publishes every client's Will, and
    the statuses come back when it does. The view is held for ``MASS_DOWN_HOLD`` s."""

    def __init__(self) -> None:
        self.since: float | None = None

    def holds(self, members: tuple[int, ...] | list[int], gone: set[int], now: float) -> bool:
        down = len(set(members) & gone)
        if down < 2 or down * 2 < len(members):
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since < MASS_DOWN_HOLD

    def ends(self, now: float) -> float | None:
        """When the hold running at ``now`` ends; None without one."""
        return self.since + MASS_DOWN_HOLD if self.since is not None and self.since + MASS_DOWN_HOLD > now else None


@dataclass(frozen=True)
class Tuning:
    """How a view's rounds run beyond who takes part (the coordinator's picks): values per
    chunk, the broadcast, local steps per round (0 / "": as the agents are configured)."""

    chunk_values: int = 0
    broadcast: str = ""
    sync_every: int = 0

    @classmethod
    def of(cls, view: View | None) -> Tuning:
        return cls() if view is None else cls(view.chunk_values, view.broadcast, view.sync_every)


class Membership:
    def __init__(self, node: int, arity: int = 2, initial: View | None = None,
                 gate: StartupGate | None = None, grace: float = 0.0,
                 offline_settle: float = 0.0, identity: ModelIdentity | None = None,
                 root_finishes_first: bool = False) -> None:
        self.node = node
        self.arity = arity
        # A round's result leaves from the view's root and the next round starts on it (``front``).
        self.root_finishes_first = root_finishes_first
        self.identity = identity or ModelIdentity()
        self.foreign: set[int] = set()  # live nodes whose model is not ours: never admitted
        self.models: dict[int, str] = {}  # node -> the fingerprint its latest live status names
        self.refused: Refusal | None = None  # the fleet's view names another model than ours
        self.unconfirmed: View | None = None  # a view of another model, its coordinator unheard
        self.gate = gate or StartupGate()
        self.states: dict[int, str] = {}
        self.sites: dict[int, str] = {}  # node -> the site its latest live status names
        self.incarnations: dict[int, int] = {}
        self.said_round: dict[int, int] = {}  # node -> the round its latest status names
        self.views: list[View] = [initial] if initial is not None else []
        self.round = 0
        self.now = self.gate.started_at
        self.grace = grace  # how long a report stands unrefuted before it counts
        self.links_busy_at = -1e18  # when our own links last showed a backlog (see links_busy)
        self.peer_busy_at: dict[int, float] = {}  # node -> when its PROGRESS last said its downlink was busy
        # A Will counts for views this long after it came: a broker going down publishes every
        # client's Will just before our own connection drops (which then holds all decisions).
        self.offline_settle = offline_settle
        self.reports: dict[int, dict[int, tuple[int, float]]] = {}  # suspect -> reporter -> (round, when)
        self.evicted: set[int] = set()  # suspected; until the node itself speaks again
        self.evicted_in: dict[int, int] = {}  # node -> our round when it was last suspected
        self.went_down: dict[int, int] = {}  # node -> our round when it last went offline
        # Nodes whose last Will came when the newest view had left them out already, with
        # no Will of theirs for FLAP_WINDOW_ROUNDS before (see _coordinate): the end of a
        # connection the fleet had given up on, not a flap.
        self.will_when_out: set[int] = set()
        self.reported_in: dict[int, int] = {}  # node -> the latest round it was reported silent in
        # Order of what we heard (statuses and views), to tell "spoke after it was dropped".
        self.seen = 0
        self.spoke_at: dict[int, int] = {}  # node -> `seen` at its last online/joining status
        self.removed_at: dict[int, int] = {}  # node -> `seen` when a view we took dropped it
        self.offline_at: dict[int, float] = {}  # node -> when its offline status came
        self.hold_until = 0.0  # no view and no eviction before this (the picture is partial)
        self.pending_views: dict[int, View] = {}  # publisher -> view, until it is the coordinator
        self.mass_down = MassDownHold()
        self.refuted: dict[tuple[int, int], int] = {}  # (suspect, reporter) -> latest round it refuted
        self.cut_at = -1  # `seen` when we were last cut off: our own Will, our site's bridge down
        self.view_taken_at = -1  # `seen` when we took the newest view
        self.new_lives: set[int] = set()  # members restarted before their Will removed them

    # ------------------------------------------------------------------ inputs

    def on_status(self, status: Status, now: float) -> list[PublishView]:
        self.now = now
        if status.incarnation < self.incarnations.get(status.node, 0):
            return []  # an older life of that node (a late Will, a stale retained status)
        self.new_lives |= _new_life(self, status)
        self.incarnations[status.node] = status.incarnation
        self.said_round[status.node] = status.round
        if status.state == "offline":
            last_will = self.went_down.get(status.node)
            if (self.views and status.node not in self.newest.members
                    and (last_will is None or self.round - last_will >= FLAP_WINDOW_ROUNDS)):
                self.will_when_out.add(status.node)
            else:
                self.will_when_out.discard(status.node)
            self.went_down[status.node] = self.round
            self.offline_at[status.node] = now
            if status.node == self.node:
                self.cut_at = self.seen + 1  # (this status's place in the order, below)
        self.states[status.node] = status.state
        if status.state == "offline":
            self.models.pop(status.node, None)
        else:
            self.models[status.node], self.sites[status.node] = status.fingerprint, status.site
        if status.state == "offline" or admits(self.identity, status):
            self.foreign.discard(status.node)  # a new life may run another model
        else:
            self.foreign.add(status.node)
        if self.unconfirmed is not None and self.unconfirmed.coordinator == status.node:
            view, self.unconfirmed = self.unconfirmed, None
            self.on_view(view)  # now we know whether its coordinator stands for its model
        self.seen += 1
        present = speaks_at(status, self.round)
        if status.state != "offline" and (present or status.node not in self.removed_at):
            self.spoke_at[status.node] = self.seen  # a dropped node far behind returns by rejoining
        if status.node != self.node and present:
            # It speaks again, at the fleet's round (a node that resumes far behind is not
            # back until it rejoins through the join path, which it then announces). Its Will
            # is not speaking: a suspected node stays suspected while the Will settles.
            for reporter, (rnd, _) in self.reports.pop(status.node, {}).items():
                key = (status.node, reporter)
                self.refuted[key] = max(rnd, self.refuted.get(key, -1))
            self.evicted.discard(status.node)
        self._retry_pending_views()
        return self._coordinate()

    def judge_suspect(self, report: Suspect) -> RejectReason | None:
        """Why a report of silence is refused (None: weighed, or simply expired). A report
        about us is kept whatever its round: the fleet may be far ahead (we hung), and that
        it went on without us is ours to learn (offer_view). The same report again after its
        suspect refuted it is no new evidence: repeated, it evicted the suspect, which
        answers each reporter's round once."""
        if report.peer == self.node or report.node == report.peer:
            return None
        if suspicion_round(report.round, self.round) is SuspicionRound.AHEAD:
            return RejectReason.SUSPECT_FUTURE_ROUND
        if report.round == self.refuted.get((report.peer, report.node)):
            return RejectReason.SUSPECT_REFUTED
        return None

    def on_suspect(self, report: Suspect, now: float) -> list[PublishView]:
        """A member heard nothing from ``report.peer`` for a whole timeout."""
        if (report.node == report.peer or self.judge_suspect(report) is not None
                or suspicion_round(report.round, self.round) is SuspicionRound.EXPIRED
                or report.round < self.refuted.get((report.peer, report.node), -1)):
            return []
        by = self.reports.setdefault(report.peer, {})
        earlier = by.get(report.node)
        if earlier is not None and earlier[0] + SUSPICION_ROUNDS >= self.round:
            # The same witness again (its machine of another round, lingering for the peer's
            # ACKs, timed out too): the suspicion stands since its first report. Restarting
            # the grace here kept a frozen leaf's next round waiting twice as long.
            by[report.node] = (max(report.round, earlier[0]), earlier[1])
        else:
            by[report.node] = (report.round, now)
        self.reported_in[report.peer] = max(report.round, self.reported_in.get(report.peer, report.round))
        return self.check(now)

    def links_busy(self, now: float) -> None:
        """Our downlink is busy with a large frame, or what we published waits to leave: a
        refutation may wait behind it (and the suspect's downlink may hold our report)."""
        self.links_busy_at = now

    def peer_busy(self, node: int, now: float) -> None:
        """``node``'s PROGRESS: a large frame is still arriving on its downlink (it lives, and
        a report about it may wait behind that frame before it can refute it)."""
        self.peer_busy_at[node] = now

    def _stands_until(self, suspect: int, heard: float) -> float:
        """When a report about ``suspect`` heard at ``heard`` counts, unrefuted: ``grace`` later,
        DOWNLINK_BUSY_HOLD more if our links or the suspect's downlink show a backlog at the
        report (BUSY_AT_REPORT before it, or later; not the last round's result read slowly by
        a node cut off right after it). On 2 MB/s links an accused inner node heard the report
        behind its leaves' units, after the grace, and was dropped (2 of 2 runs of int8); the
        suspect's PROGRESS saved it (0 of 3), our own links' backlog alone did not."""
        busy = max(self.links_busy_at, self.peer_busy_at.get(suspect, -1e18))
        return heard + self.grace + (DOWNLINK_BUSY_HOLD if busy >= heard - BUSY_AT_REPORT else 0.0)

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
        for node in self._witnessed(now) - self.evicted:
            self.evicted.add(node)
            self.evicted_in[node] = self.round
        self._retry_pending_views()
        return self._coordinate()  # also what a hold kept back

    def offer_view(self, view: View, publisher: int) -> RejectReason | None:
        """A view from ``view/<publisher>`` (the ACL lets each agent write only its own).
        Returns None when taken (or old news), else why not: only the coordinator's view counts
        (one that may become it later waits) and epochs advance by small steps, so one
        agent's forged view cannot split or halt the fleet."""
        if view.coordinator != publisher:
            return RejectReason.VIEW_NOT_ITS_PUBLISHERS
        if not self.views:
            return self._offer_first_view(view, publisher)
        newest = self.newest
        # The fleet reported us silent and went on without us: its new coordinator's view
        # is news to us even though we would still coordinate (we resumed from a hang). Only
        # from the member next in line, though: anyone else's view without us is a forgery.
        taken_out = self._takes_us_out(view)
        if taken_out and publisher == self._next_in_line() and view.epoch <= newest.epoch + MAX_EPOCH_STEP:
            self._yield_own_views(view)
            newest = self.newest
        elif taken_out and publisher != self.coordinator():
            self.pending_views[publisher] = view
            return RejectReason.VIEW_TAKES_US_OUT
        else:
            taken_out = False
        if (view.epoch, -view.coordinator) <= (newest.epoch, -newest.coordinator):
            return None
        away = self.cut_at > self.view_taken_at
        if view.epoch > newest.epoch + (MAX_AWAY_EPOCH_STEP if away else MAX_EPOCH_STEP):
            return RejectReason.VIEW_EPOCH_JUMP
        if publisher != self.coordinator() and not taken_out:
            # Held, not taken: it counts once its publisher is the coordinator (its
            # predecessor's Will or eviction may still be on the way); counted meanwhile.
            self.pending_views[publisher] = view
            return RejectReason.VIEW_NOT_COORDINATOR
        if not away and not self._removals_witnessed(view):
            # Even the coordinator removes only who we saw go offline or reported silent:
            # a compromised one cannot evict healthy members. Held until we see it too.
            # (Cut off ourselves, we saw nothing: the coordinator's word is all there is.)
            self.pending_views[publisher] = view
            return RejectReason.VIEW_REMOVAL_UNWITNESSED
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
        return self.node not in view.members and any(
            rnd + SUSPICION_ROUNDS >= self.round for rnd, _ in self.reports.get(self.node, {}).values())

    def _next_in_line(self) -> int | None:
        """Who coordinates once we are out: the lowest live member of the newest view but us
        (an online node outside it when none is left)."""
        gone = {n for n, s in self.states.items() if s != "online"} | self.suspected() | {self.node}
        online = {n for n, s in self.states.items() if s == "online"}
        candidates = sorted(set(self.newest.members) - gone) or sorted(online - gone)
        return candidates[0] if candidates else None

    def first_view(self, view: View, publisher: int) -> FirstView:
        return first_view(self, view, publisher)

    def _offer_first_view(self, view: View, publisher: int) -> RejectReason | None:
        verdict = self.first_view(view, publisher)
        if verdict is FirstView.TAKE:
            self.on_view(view)
            return None
        if verdict is FirstView.EPOCH_TOO_HIGH:
            return RejectReason.FIRST_VIEW_EPOCH
        self.pending_views[publisher] = view  # taken if its publisher turns out to coordinate
        return RejectReason.FIRST_VIEW_NOT_COORDINATOR if verdict is FirstView.NOT_COORDINATOR else None

    def _yield_own_views(self, view: View) -> None:
        """A coordinator taken for silent (overloaded, say) published views of its own while
        the fleet's new coordinator published the same epochs without it; ours win a tie
        (lower id), so we never took theirs and never learnt we were out: two fleets, and we
        never rejoined. Ours from that epoch on are void: the fleet went on without us."""
        kept = [v for v in self.views if not (v.coordinator == self.node and v.epoch >= view.epoch)]
        if kept and len(kept) < len(self.views):
            self.views = kept

    def _retry_pending_views(self) -> None:
        """A view that came before the evidence that made its publisher the coordinator (its
        predecessor's Will, the suspicion) is taken once that evidence is here."""
        for publisher, view in sorted(self.pending_views.items()):
            if not self.views:
                if self.first_view(view, publisher) is FirstView.TAKE:
                    del self.pending_views[publisher]
                    self.on_view(view)
                continue
            newest = self.newest
            if (view.epoch, -view.coordinator) <= (newest.epoch, -newest.coordinator):
                del self.pending_views[publisher]
            elif publisher == self.coordinator() and self._removals_witnessed(view):
                del self.pending_views[publisher]
                self.on_view(view)

    def _removals_witnessed(self, view: View) -> bool:
        """Every member ``view`` drops (but us: a fleet that went on without us is news we
        must take, see offer_view) is one we have our own evidence against: offline now, or
        went offline or was reported silent within EVIDENCE_ROUNDS rounds."""
        removed = set(self.newest.members) - set(view.members) - {self.node}
        return all(self._seen_gone(n) for n in removed)

    def _seen_gone(self, node: int) -> bool:
        if self.states.get(node) not in LIVE_STATES or node in self.evicted or node in self.foreign:
            return True  # offline, another model, or never heard of (the coordinator knows the fleet longer)
        recent = self.round - EVIDENCE_ROUNDS
        return self.went_down.get(node, recent - 1) >= recent or self.reported_in.get(node, recent - 1) >= recent

    def on_view(self, view: View) -> bool:
        """Keep a view if it is newer than every one known; True when it was new. A view of
        another model than ours is never kept: we are refused (``refused``) once its coordinator
        is heard running that model."""
        if view.fingerprint and view.fingerprint != self.identity.fingerprint:
            coordinator_model = self.models.get(view.coordinator)
            why = refusal(self.identity, view, coordinator_model)
            if why is not None:
                self.refused = self.refused or why
            elif coordinator_model is None:
                self.unconfirmed = view
            return False
        if self.views and (view.epoch, -view.coordinator) <= (self.newest.epoch, -self.newest.coordinator):
            return False
        self.seen += 1
        for node in set(self.newest.members if self.views else ()) - set(view.members):
            self.removed_at[node] = self.seen
        self.views.append(view)
        self.views = self.views[-KEPT_VIEWS:]
        self.view_taken_at, self.new_lives = self.seen, set()
        return True

    def round_started(self, round: int, now: float) -> list[PublishView]:
        """The node is at ``round``. Idempotent: call it again while waiting for the first
        view, the start-up gate may open by time alone."""
        self.round, self.now = round, now
        return self._coordinate()

    # ------------------------------------------------------------------ queries

    @property
    def newest(self) -> View:
        return self.views[-1]

    @property
    def latest(self) -> View | None:
        return self.views[-1] if self.views else None

    def live(self) -> list[int]:
        """Online or joining, not suspected of being silent, and running our model."""
        out = self.suspected() | self.foreign
        return sorted(n for n, s in self.states.items() if s in LIVE_STATES and n not in out)

    def suspected(self) -> frozenset[int]:
        """Nodes enough distinct members reported silent (see the module's rule), until they
        speak again."""
        return frozenset(self.evicted)

    def unrefuted(self, now: float) -> list[tuple[int, int]]:
        """(peer, round) of every report that stood unrefuted for ``grace``: within that
        round nobody needs to wait for the peer's contribution any more."""
        return [(peer, rnd) for peer, by in self.reports.items() for rnd, t in by.values()
                if self._stands_until(peer, t) <= now]

    def next_check(self) -> float | None:
        """When a pending report's grace ends, or a hold (None: nothing pending)."""
        times = [at for peer, by in self.reports.items() if peer not in self.evicted
                 for _, t in by.values() if (at := self._stands_until(peer, t)) > self.now]
        if self.hold_until > self.now:
            times.append(self.hold_until)
        # The same sum as in _coordinate: the check at this time must find the Will settled
        # (now - t >= settle could round below settle, and nothing woke the coordinator again).
        times += [t + self.offline_settle for n, t in self.offline_at.items()
                  if self.states.get(n) == "offline" and t + self.offline_settle > self.now]
        if (hold_ends := self.mass_down.ends(self.now)) is not None:
            times.append(hold_ends)
        return min(times) if times else None

    def _witnessed(self, now: float) -> set[int]:
        out: set[int] = set()
        for peer, by in self.reports.items():
            if peer == self.node:
                continue  # reports about us are for the others to judge (see offer_view)
            if any(rnd + SUSPICION_ROUNDS >= self.round and self._stands_until(peer, t) <= now
                   and self.states.get(r) == "online" for r, (rnd, t) in by.items()):
                out.add(peer)
        # Those suspected lately count even when they spoke since (each refuted too late: a
        # congested broker), and so do the members they were, however the views shrank.
        recent = {n for n, r in self.evicted_in.items() if r + EVICTION_WINDOW_ROUNDS >= self.round}
        members = (set(self.newest.members) if self.views else set(self.states)) | self.evicted | recent
        if len((self.evicted | out | recent) & members) * 2 >= len(members):
            return set()  # a majority "silent" is a congested broker, not frozen nodes
        return out

    def is_down(self, node: int) -> bool:
        """Offline (a Will or a clean exit) or suspected: nobody should wait for it."""
        return self.states.get(node) == "offline" or node in self.suspected()

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
        live, members = self.live(), set(self.latest.members if self.latest else ())
        return self.online_peers([n for n in live if n in members]) or self.online_peers(live)

    def knows_incarnation(self, node: int, incarnation: int) -> bool:
        return self.incarnations.get(node) == incarnation and node in self.states

    def coordinator(self) -> int | None:
        """The lowest member of the newest view not known to be offline, joining or silent;
        an online node outside the view only when no member is left. So a node that resumes
        after the fleet went on without it defers to the newer view (no split brain), and a
        joiner, which does not know the fleet's round yet, never coordinates."""
        gone = {n for n, s in self.states.items() if s != "online"} | self.suspected()
        current = set(self.newest.members) if self.views else set()
        online = {n for n, s in self.states.items() if s == "online"}
        candidates = sorted(current - gone) or sorted(online - gone)
        return candidates[0] if candidates else None

    def view_for(self, round: int) -> View | None:
        """The newest view applying to ``round``; with none, the newest view there is."""
        usable = [v for v in self.views if v.from_round <= round]
        if usable:
            return max(usable, key=lambda v: v.epoch)
        return self.newest if self.views else None

    def members_for(self, round: int) -> tuple[int, ...]:
        view = self.view_for(round)
        return tuple(view.members) if view is not None else ()

    # ------------------------------------------------------------------ coordinator

    def _coordinate(self) -> list[PublishView]:
        if self.coordinator() != self.node or self.now < self.hold_until:
            return []
        if not self.views:
            return self._first_view()
        # Absence of a status is not news (statuses trickle in at start-up): only an explicit
        # offline or enough witnesses remove a member, only online/joining adds one.
        gone = {n for n, s in self.states.items() if s not in LIVE_STATES
                and self.offline_at.get(n, -1e9) + self.offline_settle <= self.now}
        gone |= self.suspected() | self.foreign
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
        current = set(self.newest.members)
        returning = {n for n in self.live() if n in current
                     or self.spoke_at.get(n, -1) > self.removed_at.get(n, -1)}
        live = sorted((current - gone) | (returning - (settling - current)))
        if (list(self.newest.members) == live and not self.new_lives & set(live)) or self.mass_down.holds(self.newest.members, gone, self.now) or not self.has_quorum(live):
            return []
        first = first_round(self, live, gone)
        if self.newest.from_round > self.round:
            return self._amend_pending(live, first)
        return self._publish(live, self.newest.epoch + 1, first)

    def _amend_pending(self, live: list[int], first: int) -> list[PublishView]:
        """The last change has not taken effect yet. While nobody can have reached its first
        round (and it is not too soon for this change), the pending view is replaced (same
        ``from_round``) by one of ``live``: a group healed together gets one view. Else the
        change is a view of its own right after it."""
        pending, ahead = self.newest.from_round, front(self)
        amend = self.newest.coordinator == self.node and pending > ahead and pending >= first
        return self._publish(live, self.newest.epoch + 1, pending if amend else max(first, ahead + 1))

    def has_quorum(self, live: list[int] | set[int]) -> bool:
        """Whether a view of ``live`` may follow the newest one: it keeps more than half of
        its members, or exactly half with the lowest of them (the tie rule of a 50/50 split:
        docs/PARTITIONS.md). A side cut off with fewer never forms a fleet of its own: it
        waits (the core holds its rounds, see RoundGate.mostly_down) and rejoins."""
        # Against the view in effect too: Wills come one by one, and each view against the
        # one just published (not yet in effect) kept a majority of it, down to a minority.
        in_effect = self.view_for(self.round)
        return all(_keeps_quorum(view.members, live) for view in (self.newest, in_effect) if view is not None)

    def _first_view(self) -> list[PublishView]:
        live = self.live()
        # A node with another model has come too: the gate waits for nobody more on its account.
        if not self.gate.is_open(len(live) + len(self.foreign), self.now):
            return []
        return self._publish(live, 1, self.round)

    def change_chunks(self, chunk_values: int, broadcast: str | None = None) -> list[PublishView]:
        """As coordinator, cut the vector into chunks of ``chunk_values`` (0: the configured
        size) and send the result as ``broadcast`` says ("": the configured way; None: as the
        newest view does) from ``LEAD_ROUNDS`` on: see ``retune``."""
        broadcast = self.newest.broadcast if broadcast is None and self.views else broadcast
        return self.retune(replace(Tuning.of(self.latest), chunk_values=chunk_values, broadcast=broadcast or ""))

    def retune(self, tuning: Tuning) -> list[PublishView]:
        """As coordinator, run the rounds from ``LEAD_ROUNDS`` on as ``tuning`` says: a view with
        the same members. Nothing while a change is still pending (views stay ordered, no
        burst) or when it is the newest view's."""
        if self.coordinator() != self.node or not self.views or self.now < self.hold_until:
            return []
        if self.newest.from_round > self.round or Tuning.of(self.newest) == tuning:
            return []
        return self._publish(list(self.newest.members), self.newest.epoch + 1, self.round + LEAD_ROUNDS, tuning)

    def _publish(self, members: list[int], epoch: int, from_round: int,
                 tuning: Tuning | None = None) -> list[PublishView]:
        # A membership change keeps the tuning of the newest view (a new coordinator decides again).
        tuning, own = tuning or Tuning.of(self.latest), self.identity
        view = View(epoch=epoch, members=members, arity=self.arity, coordinator=self.node,
                    from_round=from_round, chunk_values=tuning.chunk_values, broadcast=tuning.broadcast,
                    sync_every=tuning.sync_every, fingerprint=own.fingerprint, model=own.name, params=own.params,
                    sites=sites_of(self.sites, members))
        self.on_view(view)
        return [PublishView(view)]


def front(m: Membership) -> int:
    """The furthest round a member can have started: ours while we are the root of the round
    under way and its result leaves from us (the next round starts on that result, and our
    view goes out before it), else the next one."""
    view = m.view_for(m.round)
    root_leads = m.root_finishes_first and view is not None and view_root(view) == m.node
    return m.round if root_leads else m.round + 1


def first_round(m: Membership, live: list[int], gone: set[int]) -> int:
    """The round a new view of ``live`` applies from, published by coordinator ``m``. Without
    its root no round of the current tree can finish, so nobody gets past the next round with
    it (the core waits): the next. A view that only adds members (a site back from a cut)
    applies right after the furthest round anybody can have started: a round sooner than
    LEAD_ROUNDS, which a view that removes members keeps (each member takes it only once it
    has seen them go), and so does one that takes back a member a pending view drops (its
    removal stands)."""
    if view_root(m.newest) in gone:
        return m.round + 1
    in_effect = m.view_for(m.round) or m.newest
    dropping = set(in_effect.members) - set(m.newest.members)
    adds_only = set(m.newest.members) <= set(live) and not dropping & set(live)
    return front(m) + 1 if adds_only else m.round + LEAD_ROUNDS


def fleet_finished(node: int, rounds: int, members: list[int] | tuple[int, ...],
                   said_round: dict[int, int], known: set[int]) -> bool:
    """The fleet ran all of ``rounds``: every one of ``members`` but ``node`` said so in its
    latest status (a clean exit's offline status, or a lingering member's online one), or more
    than half of the ``known`` nodes did. The majority covers nodes cut off together: each
    names a round short of the end, so the view they are in never finishes; one liar alone
    ends nobody's run."""
    if rounds <= 0:
        return False
    done = {n for n, r in said_round.items() if n != node and r >= rounds}
    others = [m for m in members if m != node]
    if others and all(m in done for m in others):
        return True
    return len(done) * 2 > len(known | {node})


def _new_life(m: Membership, status: Status) -> set[int]:
    """A member of the newest view restarted (a new incarnation) before its Will removed it:
    it has no state and waits for a view to join, which no membership change would bring."""
    known = m.incarnations.get(status.node, status.incarnation)
    member = bool(m.views) and status.node in m.newest.members
    return {status.node} if status.state != "offline" and member and status.incarnation > known else set()


def first_view(m: Membership, view: View, publisher: int) -> FirstView:
    """Whether to take ``view`` from ``publisher`` as the first view we know: only from the
    node our own statuses say coordinates (the lowest online one, leaving us out: we may
    be a lower id that (re)joins a fleet that went on without us), with an epoch the fleet
    can still count up from. Before, any member's view was taken: one published before
    the fleet's first made its publisher root for the whole run."""
    if view.epoch > MAX_FIRST_EPOCH:
        return FirstView.EPOCH_TOO_HIGH
    if m.states.get(publisher) != "online":
        return FirstView.WAIT  # not heard yet, or gone (a stale retained view): held
    lower = [n for n, s in m.states.items()
             if s == "online" and n < publisher and n != m.node and n not in m.suspected()]
    return FirstView.NOT_COORDINATOR if lower else FirstView.TAKE
