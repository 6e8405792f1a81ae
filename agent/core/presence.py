"""Who is there, into an agent core: statuses (a peer's, a newer life of our own node, a
broker's Will), a site's bridge going down, the coordinator's views, and our own connection
to the broker dropping and coming back."""

from __future__ import annotations

from agent.core.actions import CoreAction, Displaced
from agent.core.parts import CoreParts
from agent.core.progress import Phase, Progress, Trigger
from agent.core.steps import Steps
from agent.protocol.membership import LIVE_STATES, PublishView, cut_off
from agent.protocol.messages import Status, View
from agent.protocol.notes import NoteKind


class Presence:
    def __init__(self, parts: CoreParts, progress: Progress, steps: Steps) -> None:
        self.parts, self.progress, self.steps = parts, progress, steps

    def status(self, status: Status, now: float) -> list[CoreAction]:
        parts, membership = self.parts, self.parts.membership
        # A newer life of this node (even its Will: mosquitto publishes it when our own
        # reconnect takes the session from it) means we are the obsolete one.
        if status.node == parts.node and status.incarnation > parts.incarnation and self.progress.phase != Phase.DONE:
            self.progress.go(Trigger.DISPLACED)
            parts.outbox.note(NoteKind.DISPLACED, parts.node, f"by incarnation {status.incarnation}")
            return [Displaced(status.incarnation, status.pid)]
        peer = status.node
        parts.period.heard(status)
        was_down = membership.is_down(peer)
        was_reported = peer in membership.witnesses.reports
        out: list[CoreAction] = parts.outbox.views(membership.on_status(status, now))
        if was_reported and peer not in membership.witnesses.reports:
            # It refuted a report of silence: what the machines held for the verdict goes.
            out += parts.rounds.each(lambda m: m.peer_spoke(peer, now))
        back = was_down and not membership.is_down(peer)
        if back:
            # Back (restarted, resumed, rejoining): links found dead while it was away are
            # not evidence about the new life; do not route around it from the start.
            parts.links.heal(peer)
        if self.progress.phase == Phase.CONNECTING and membership.knows_incarnation(parts.node, parts.incarnation):
            out += self.steps.connected(now)
        if status.state == "offline" and peer != parts.node and membership.states.get(peer) == "offline":
            out += parts.rounds.will(peer, status.incarnation, now)  # the broker's Last Will
        elif back:
            out += parts.rounds.root_back(peer, status.incarnation, now)
        return out + self.steps.advance(now)

    def bridge_down(self, site: str, now: float) -> list[CoreAction]:
        """A bridge went down: the nodes on its far side are gone for us, as if their Wills
        came (their own come back when it heals: the brokers resend the retained statuses)."""
        parts, membership = self.parts, self.parts.membership
        out: list[CoreAction] = []
        if site == parts.config.site:
            membership.cut_off()
        for peer in cut_off(membership.sites, parts.config.site, site):
            if peer != parts.node and membership.states.get(peer) in LIVE_STATES:
                out += self.status(membership.will_of(peer), now)
        return out

    def view(self, view: View, now: float, publisher: int | None) -> list[CoreAction]:
        if publisher is None:
            self.parts.membership.on_view(view)
        elif (why := self.parts.membership.offer_view(view, publisher)) is not None:
            self.parts.counters.rejected[why] += 1
        return self.steps.advance(now)

    def disconnected(self, now: float) -> list[CoreAction]:
        """The broker is away: the round under way ends by its deadline, and no new round
        starts until we are back (alone, a node would race through rounds nobody else runs)."""
        self.parts.broker.connected = False
        self.parts.broker.disconnected_at = now
        # The broker may have published everybody's Will as it went down: none of that is
        # news about the peers until it is back and they could say otherwise. The fleet may
        # have had ours, or lost our site: its view without us is news when we are back.
        self.parts.membership.hold(float("inf"))
        self.parts.membership.cut_off()
        self.parts.outbox.note(NoteKind.DISCONNECTED, None, "no new round until the broker is back")
        return []

    def reconnected(self, now: float) -> list[CoreAction]:
        """The connection to the broker came back; the broker may have restarted and lost
        every retained status and the view. Say again who we are (the transport's birth
        message is the status of our start), the coordinator republishes its view, and
        nobody decides views or evictions from the partial picture for a while."""
        parts, membership = self.parts, self.parts.membership
        parts.outbox.note(NoteKind.RECONNECTED, None, "statuses and view published again")
        parts.broker.connected = True
        membership.hold(now + parts.config.reconnect_hold)
        out: list[CoreAction] = []
        if self.progress.phase not in (Phase.CONNECTING, Phase.DONE):
            out.append(self.steps.my_status())
        out += parts.rounds.reconnected(self.progress.round, now - parts.broker.disconnected_at, now)
        out += parts.fetch.retry_now(now, self.progress.round)
        latest = membership.views.latest
        if latest is not None and latest.coordinator == parts.node and membership.coordinator() == parts.node:
            out += parts.outbox.views([PublishView(latest)])
        return out
