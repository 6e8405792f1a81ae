"""Frames of one FT-tree round that pass through this node: units relayed or flooded towards
another member, and the ACKs that come back the same way. Floods are passed on once each."""

from __future__ import annotations

from dataclasses import replace

from agent.protocol.ft_scope import Hop, RoundScope, flood_key
from agent.protocol.ft_watch import PeerWatch
from agent.protocol.notes import NoteKind
from agent.protocol.wire import Flag, Frame


class Relay:
    def __init__(self, scope: RoundScope, watch: PeerWatch) -> None:
        self.scope = scope
        self.watch = watch
        self.seen_floods: set[tuple[object, ...]] = set()
        self.relayed_pairs: set[tuple[int, int]] = set()  # (origin, target) we relayed for

    def flood(self, frame: Frame, exclude: int | None) -> None:
        scope = self.scope
        for peer in scope.neighbours:
            if peer != exclude and peer not in scope.dead and peer not in scope.down:
                scope.out.send(peer, replace(frame, sender=scope.node))

    def flood_own(self, frame: Frame) -> None:
        """Flood a frame of ours (its echoes are not passed on again)."""
        self.seen_floods.add(flood_key(frame))
        self.flood(frame, exclude=None)

    def first_time(self, frame: Frame) -> bool:
        """A flooded frame not seen before (remembered now)."""
        key = flood_key(frame)
        if key in self.seen_floods:
            return False
        self.seen_floods.add(key)
        return True

    def on_relay(self, frame: Frame, now: float) -> Hop | None:
        """A RELAY frame: passed on towards its target, or (for us) how it came."""
        scope = self.scope
        flooded = bool(frame.flags & Flag.FLOOD)
        if flooded and not self.first_time(frame):
            return None
        if frame.target == scope.node:
            return Hop.FLOOD if flooded else Hop.RELAY
        scope.stats.relays += 1
        if (frame.origin, frame.target) not in self.relayed_pairs:
            self.relayed_pairs.add((frame.origin, frame.target))
            scope.out.note(NoteKind.RELAY, frame.origin, f"to {frame.target}")
        onward = replace(frame, sender=scope.node)
        if not flooded:
            # The target ACKs through us: silence from it is our evidence, too.
            self.watch.watch_relay(frame.target, now)
        if flooded or frame.target in scope.dead:
            self.flood(replace(onward, flags=onward.flags | Flag.FLOOD), exclude=frame.sender)
        else:
            scope.out.send(frame.target, onward)
        return None

    def pass_ack(self, frame: Frame) -> None:
        """An ACK for another member: on towards it, the way it came."""
        onward = replace(frame, sender=self.scope.node)
        if frame.flags & Flag.FLOOD:
            if self.first_time(frame):
                self.flood(onward, exclude=frame.sender)
        else:
            self.scope.out.send(frame.target, onward)
