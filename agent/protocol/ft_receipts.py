"""What a node of one FT-tree round tells the senders of the units it receives: ACKs, batched
for units that came straight from their sender, and NACKs of the gaps a link's in-order
delivery shows.

A unit that came straight from its sender is ACKed in a batch, one ACK frame listing the chunk
indices (u32 payload) of every unit with the same contributor set from that sender: at once
when the unit is the last chunk, is large (``ACK_AT_ONCE_BYTES``: its ACK must not queue behind
what the unit makes us forward) or ``ACK_EVERY`` units wait, else ``ACK_DELAY`` after the first
waiting one (at most a quarter of the link's RTO), and at once when the round ends here. Frames
on one link arrive in order, so a gap in an ACK still means a loss (fast retransmit). Relayed
and flooded units are ACKed one by one.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.protocol.ft_relay import Relay
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.notes import NoteKind
from agent.protocol.wire import Flag, Frame, Kind

ACK_EVERY = 8  # direct units ACKed by one frame at most (see the module docstring)
ACK_DELAY = 0.005  # s: longest wait of a direct unit for its batched ACK (<= a quarter RTO)
# A unit this large is ACKed at once: its ACK then leaves before whatever the unit makes us send
# (its transmission dwarfs an ACK frame, and a batched ACK would queue behind a forwarded MB).
ACK_AT_ONCE_BYTES = 65_536


class Receipts:
    def __init__(self, scope: RoundScope, relay: Relay) -> None:
        self.scope = scope
        self.relay = relay
        # Batched ACKs of direct units: sender -> (flags, contributors) -> chunk indices.
        self.ack_due: dict[int, dict[tuple[Flag, frozenset[int]], list[int]]] = {}
        self.ack_at: dict[int, float] = {}  # sender -> when its batch goes out at the latest
        self.nacked: set[tuple[int, bool, int]] = set()  # (sender, broadcast, chunk) asked for

    def ack(self, frame: Frame, how: Hop, now: float, batch: bool) -> None:
        """ACK a unit that came to us ``how``; ``batch``: direct units may wait for company
        (not once the round ended here: nobody waits for our timer then)."""
        scope = self.scope
        if how == Hop.DIRECT and batch:
            big = len(frame.payload) >= ACK_AT_ONCE_BYTES
            self._batch(frame.sender, frame.flags & Flag.BROADCAST, frame, now, big)
            return
        flags = (frame.flags & Flag.BROADCAST) | (Flag.FLOOD if how == Hop.FLOOD else Flag.NONE)
        ack = Frame(Kind.ACK, scope.cfg.job, scope.round, scope.node, frame.chunk_index, scope.n,
                    Flag(flags), origin=scope.node, target=frame.origin,
                    contributors=frame.contributors)
        if how == Hop.FLOOD:
            self.relay.flood_own(ack)
        else:
            scope.out.send(frame.sender, ack)

    def ack_fanned(self, frame: Frame, parent: int, now: float) -> None:
        """ACK a chunk of the root's fan-out to our ``parent``, batched as if it had sent it."""
        self._batch(parent, Flag.BROADCAST, frame, now, at_once=False)

    def _batch(self, sender: int, flags: Flag, frame: Frame, now: float, at_once: bool) -> None:
        batch = self.ack_due.setdefault(sender, {}).setdefault((flags, frame.contributors), [])
        if frame.chunk_index not in batch:
            batch.append(frame.chunk_index)
        if frame.chunk_index == self.scope.n - 1 or len(batch) >= ACK_EVERY or at_once:
            self.send_acks(sender)
        elif sender not in self.ack_at:
            self.ack_at[sender] = now + min(ACK_DELAY, self.scope.rto(sender) / 4)

    def send_acks(self, sender: int | None = None) -> None:
        """Send the batched ACKs of ``sender`` (everybody's when None)."""
        scope = self.scope
        for peer in [sender] if sender is not None else list(self.ack_due):
            self.ack_at.pop(peer, None)
            for (flags, ids), indices in self.ack_due.pop(peer, {}).items():
                ack = Frame(Kind.ACK, scope.cfg.job, scope.round, scope.node, max(indices), scope.n,
                            flags, origin=scope.node, target=peer, contributors=ids)
                scope.out.send(peer, ack.with_indices(sorted(indices)) if len(indices) > 1 else ack)

    def on_timer(self, now: float) -> None:
        for sender, at in list(self.ack_at.items()):
            if now >= at:
                self.send_acks(sender)

    def timers(self) -> list[float]:
        return list(self.ack_at.values())

    def nack_gaps(self, frame: Frame, have: Callable[[int], bool]) -> None:
        """Chunks before ``frame``'s that its sender sent earlier on the same link and that we
        lack were lost: ask for them once."""
        scope = self.scope
        broadcast = frame.is_broadcast
        missing = [i for i in range(frame.chunk_index)
                   if not have(i) and (frame.sender, broadcast, i) not in self.nacked]
        if not missing:
            return
        self.nacked.update((frame.sender, broadcast, i) for i in missing)
        scope.stats.nacks += 1
        scope.book.mark(frame.sender, "suspected")
        scope.out.note(NoteKind.NACK, frame.sender, f"{len(missing)} chunks")
        flags = Flag.BROADCAST if broadcast else Flag.NONE
        nack = Frame(Kind.NACK, scope.cfg.job, scope.round, scope.node, 0, scope.n, flags)
        scope.out.send(frame.sender, nack.with_indices(missing))
