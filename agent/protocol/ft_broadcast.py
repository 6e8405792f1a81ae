"""The broadcast of one FT-tree round's result: what this node has of it (``ResultBook``) and
how the root's result reaches every member, by one of two strategies behind one interface
(``BroadcastStrategy``):

- ``TreeBroadcast`` (``broadcast: tree``): every node sends each result chunk on to its
  children (and to members whose data reached it by another way), each unit ACKed and routed
  around dead links by the courier;
- ``FanoutBroadcast`` (``broadcast: fanout``): the root publishes each chunk once on its fan-out
  topic, which every member reads; a chunk a member misses is pulled from its parent, and every
  member ACKs the fan-out to its parent, whose wait for a silent child counts on that.

Every copy of the result is the root's bytes: the root quantizes each chunk once and everybody
passes exactly those bytes on, so every member applies the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from agent.protocol.answer_budget import padded
from agent.protocol.ft_courier import Courier, Pending, Route
from agent.protocol.ft_receipts import ACK_AT_ONCE_BYTES, Receipts
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.notes import NoteKind
from agent.protocol.wire import NO_NODE, Flag, Frame, Kind


@dataclass
class ResultChunk:
    lo: int
    hi: int
    final: np.ndarray | None = None
    final_ids: frozenset[int] = frozenset()
    final_frame: Frame | None = None  # the result as it travels (its format and bytes)


class ResultBook:
    """The result's chunks at this node, and how each member is reached with them."""

    def __init__(self, scope: RoundScope, courier: Courier) -> None:
        self.scope, self.courier = scope, courier
        self.chunks = [ResultChunk(lo, hi) for lo, hi in scope.bounds]
        self.routes: dict[int, Route] = {}  # how to reach a peer whose data came oddly
        self.adopted: set[int] = set()  # non-children that delivered their data to us

    def __getitem__(self, j: int) -> ResultChunk:
        return self.chunks[j]

    def has(self, j: int) -> bool:
        return self.chunks[j].final is not None

    def complete(self) -> bool:
        return all(ch.final is not None for ch in self.chunks)

    def assemble(self, gradient: np.ndarray, node: int, skip_missing: bool
                 ) -> tuple[np.ndarray, list[frozenset[int]], list[int]]:
        """What to apply: the result's chunks; where there is none, our own values (a missing
        chunk) or, ``skip_missing``, nothing (zeros, no contributors). Also when the root's
        mean lacks us (the fleet routed around us: our Will came, our data never made it): the
        fleet's mean as it is, so our model stays the fleet's. Adding our own value made it
        drift, and every flap of a connection cost a state transfer the round after."""
        values = np.empty(len(gradient), dtype=np.float32)
        contributors: list[frozenset[int]] = []
        missing: list[int] = []
        for j, ch in enumerate(self.chunks):
            if ch.final is None and skip_missing:
                values[ch.lo : ch.hi] = 0.0
                contributors.append(frozenset())
            elif ch.final is not None:
                values[ch.lo : ch.hi] = ch.final
                contributors.append(ch.final_ids)
            else:
                values[ch.lo : ch.hi] = gradient[ch.lo : ch.hi]
                contributors.append(frozenset({node}))
                missing.append(j)
        return values, contributors, missing

    def missing(self) -> list[int]:
        return [j for j, ch in enumerate(self.chunks) if ch.final is None]

    def learn_route(self, origin: int, hop: int, how: Hop) -> None:
        """A unit from ``origin`` came ``how`` (by ``hop``): answer it the same way."""
        scope = self.scope
        if how == Hop.DIRECT:
            if origin not in scope.children and origin != scope.parent:
                self.adopted.add(origin)
            return
        scope.book.mark(origin, "rerouted")
        if origin not in scope.children:
            self.adopted.add(origin)
        # The direct link failed one way at least: answer by the path that worked.
        self.routes[origin] = Route(Hop.RELAY, hop, origin) if how == Hop.RELAY else Route(Hop.FLOOD, -1, origin)

    def broadcast_peers(self) -> list[int]:
        scope = self.scope
        peers = set(scope.children) | self.adopted
        return sorted(peers - scope.down - {scope.node})

    def _down_routes(self, peer: int) -> list[Route]:
        known = self.routes.get(peer)
        if known is not None:
            return [known] if known.kind == Hop.FLOOD else [known, Route(Hop.FLOOD, -1, peer)]
        routes = [Route(Hop.DIRECT, peer, peer)]
        routes += [Route(Hop.RELAY, b, peer) for b in self.scope.tree.backups(peer) if b != self.scope.node]
        routes.append(Route(Hop.FLOOD, -1, peer))
        return routes

    def send_down(self, j: int, peer: int, now: float) -> None:
        """Chunk ``j`` of the result to ``peer``, relayed as down the tree: ACKed, resent and
        routed around dead links (a copy already on its way is not sent twice)."""
        ch = self.chunks[j]
        routes = self._down_routes(peer)
        if routes and ch.final_frame is not None and (True, j, peer) not in self.courier.pending:
            self.courier.send(Pending(True, j, peer, ch.final_ids, ch.final_frame, routes), now)

    def its_parent_sends_it(self, peer: int) -> bool:
        """``peer`` asked us for a result we did not have yet; its parent, alive as far as we
        know, broadcasts it anyway. In a round stalled on a frozen node every member pulls:
        each copy sent from here doubled their broadcast (30 MB more at 15 agents)."""
        tree = self.scope.tree
        parent = tree.parent(peer) if peer in tree.members else None
        return parent is not None and parent != self.scope.node and parent not in self.scope.down


class BroadcastStrategy(Protocol):
    def peers(self) -> list[int]:
        """Whom this node sends each result chunk to, ACKed."""
        ...

    def published(self, j: int, frame: Frame, now: float) -> None:
        """Chunk ``j``'s result is set here, as ``frame``."""
        ...

    def completed(self, now: float) -> None:
        """Every chunk's result is set here."""
        ...

    def fanned(self, frame: Frame) -> bool:
        """``frame`` came on the root's fan-out topic."""
        ...

    def child_acked(self, frame: Frame, indices: list[int], now: float) -> None: ...

    def timers(self) -> list[float]: ...

    def on_timer(self, now: float) -> None: ...

    def reconnected(self) -> None:
        """Our connection dropped in this round: what we published may be lost."""
        ...


class TreeBroadcast:
    def __init__(self, results: ResultBook) -> None:
        self.results = results

    def peers(self) -> list[int]:
        return self.results.broadcast_peers()

    def published(self, j: int, frame: Frame, now: float) -> None:
        pass

    def completed(self, now: float) -> None:
        pass

    def fanned(self, frame: Frame) -> bool:
        return False

    def child_acked(self, frame: Frame, indices: list[int], now: float) -> None:
        pass

    def timers(self) -> list[float]:
        return []

    def on_timer(self, now: float) -> None:
        pass

    def reconnected(self) -> None:
        pass


class FanoutBroadcast:
    def __init__(self, scope: RoundScope, results: ResultBook, courier: Courier, receipts: Receipts) -> None:
        self.scope, self.results, self.courier, self.receipts = scope, results, courier, receipts
        self.fanned_at: dict[int, float] = {}  # chunk -> when the fan-out sent (root) or brought it
        self.fan_sampled: set[int] = set()  # children whose ACK of the fan-out gave an RTT sample
        self.fan_acked: dict[int, set[int]] = {}  # child -> chunks of the result it ACKed
        self.fan_watch: dict[int, float] = {}  # child -> when its ACK of the whole result is due
        self.gaps_pulled: set[int] = set()  # chunks lost in the root's fan-out, asked for
        self.completed_at: float | None = None  # when every chunk's result was set here
        self.probed: dict[int, float] = {}  # peer -> when we asked it for a word (see on_timer)

    def peers(self) -> list[int]:
        return []  # every member reads the root's fan-out

    def published(self, j: int, frame: Frame, now: float) -> None:
        if self.scope.parent is None:
            self.scope.out.fanout(frame)
            self.fanned_at[j] = now

    def completed(self, now: float) -> None:
        """Every child ACKs the root's fan-out to us (see take): it reached us, and reaches a
        live child about as soon, so one that has ACKed none of it within two round trips is
        asked for a word (a PROBE: a few bytes, cheap when it is only late) and, answering
        nothing within an RTO, reported silent (see on_timer): so a child frozen or cut off in
        this round is found silent in it. Without that a frozen leaf was found only by the next
        round's wait for its contribution (0.64 s against a 0.038 s round). A child that lives
        but ACKed nothing gets the result from us, each chunk ACKed and routed around dead
        links, as relayed down the tree."""
        scope = self.scope
        self.completed_at = now
        for child in self.results.broadcast_peers():
            if len(self.fan_acked.get(child, ())) < scope.n:
                rtt = scope.links.measured_rtt(child)
                wait = scope.rto(child) if rtt is None else min(scope.rto(child), 2 * rtt)
                self.fan_watch[child] = now + wait

    def fanned(self, frame: Frame) -> bool:
        """A result chunk from the root's fan-out topic (the core lets nothing else come from
        there; on a link topic a result always names its target)."""
        return (frame.kind == Kind.DATA and frame.is_broadcast
                and frame.target == NO_NODE and frame.sender == frame.origin)

    def take(self, frame: Frame, now: float, acking: bool) -> bool:
        """A chunk of the result on the root's fan-out topic: from this round's root only (the
        topic names its publisher, whom the ACL lets write it alone); not ACKed to the root
        (it waits for nobody) but to our parent (``acking``). Frames of one topic arrive in
        order: an earlier chunk that did not come was lost, and is pulled from our parent at
        once. True: the chunk is new here, to be checked and set as the result."""
        scope, j = self.scope, frame.chunk_index
        if frame.sender != scope.tree.root or scope.parent is None or not frame.contributors:
            scope.stats.dropped += 1
            return False
        if self.results.has(j):
            return False
        if scope.root_hash is None:
            scope.root_hash = frame.model_hash
        self.fanned_at[j] = now
        if acking:
            # Our parent sends us nothing else that we ACK: these give it the RTO of its link
            # to us (its waits for a silent child count on it).
            self.receipts.ack_fanned(frame, scope.parent, now)
        # Our units of chunk j that the result counts arrived: their ACKs only could still
        # tell us so (a lost ACK left such a unit waiting for a backup route). An ACK sent at
        # once (the last chunk, a large unit) came before the fan-out (causal order through one
        # broker): missing, the link from that peer is cut one way or lossy.
        self.courier.settle(j, frame.contributors, lambda p: (
            j == scope.n - 1 or len(p.frame.payload) >= ACK_AT_ONCE_BYTES))
        self._pull_gaps(j)
        return True

    def _pull_gaps(self, j: int) -> None:
        """Ask our parent for the chunks before ``j`` that the fan-out did not bring (once)."""
        scope = self.scope
        gaps = [i for i, ch in enumerate(self.results.chunks[:j])
                if ch.final is None and i not in self.gaps_pulled]
        if not gaps or scope.parent is None or scope.parent in scope.down:
            return
        self.gaps_pulled.update(gaps)
        scope.stats.nacks += 1
        scope.out.note(NoteKind.NACK, scope.parent, f"{len(gaps)} chunks lost in the fan-out: pulled")
        pull = Frame(Kind.PULL, scope.cfg.job, scope.round, scope.node, 0, scope.n, Flag.BROADCAST)
        scope.out.send(scope.parent, padded(pull.with_indices(gaps), scope.result_bytes(gaps)))

    def child_acked(self, frame: Frame, indices: list[int], now: float) -> None:
        """A child ACKed the fan-out: one RTT sample per child and round, when we had every
        chunk it ACKs. Its sample runs from when we sent (the root) or got the chunk: about
        one trip short of a round trip, under the RTO floor here."""
        child = frame.sender
        if not (frame.is_broadcast and child == frame.origin and child in self.scope.children):
            return
        acked = self.fan_acked.setdefault(child, set())
        acked.update(j for j in indices if 0 <= j < self.scope.n)
        if len(acked) == self.scope.n:
            self.fan_watch.pop(child, None)
        if child in self.fan_sampled or not all(j in self.fanned_at for j in indices):
            return
        self.fan_sampled.add(child)
        self.scope.links.observe(child, max(0.0, now - max(self.fanned_at[j] for j in indices)))

    def timers(self) -> list[float]:
        return list(self.fan_watch.values()) + [self._verdict_at(p, at) for p, at in self.probed.items()]

    def on_timer(self, now: float) -> None:
        for child, due in list(self.fan_watch.items()):
            if due > now:
                continue
            del self.fan_watch[child]
            if child in self.scope.down or self.fan_acked.get(child):
                continue  # (one that ACKed a part lives, and pulls what it lacks)
            if self._shown_life(child, self.completed_at):
                self._copy_when_due(child, now)
            else:
                self._probe(child, now)
                self._probe_below(child, now)
        self._judge_probed(now)

    def _shown_life(self, peer: int, since: float | None) -> bool:
        # Strictly after: the root completes the moment a child's last unit comes.
        return since is not None and self.courier.watch.shown_life(peer, since)

    def _copy_when_due(self, child: int, now: float) -> None:
        """``child`` lives and ACKed none of the result: its downlink may still be busy with
        the fan-out (its PROGRESS) for as long as the result takes on its link; then it gets
        the result from us."""
        scope, start = self.scope, self.completed_at if self.completed_at is not None else now
        due = start + scope.rto(child) + scope.transmit(child, scope.n * scope.unit_bytes)
        if due > now:
            self.fan_watch[child] = due
            return
        for j in range(scope.n):
            self.results.send_down(j, child, now)

    def _probe(self, peer: int, now: float) -> None:
        scope = self.scope
        self.probed[peer] = now
        scope.out.send(peer, scope.frame(Kind.PROBE, 0, Flag.NONE, frozenset(), target=peer))

    def _verdict_at(self, peer: int, at: float) -> float:
        due = at + self.scope.rto(peer)
        drained = self.courier.watch.drain_end((peer,))  # our links or its busy: its answer may queue
        return due if drained is None else max(due, drained)

    def _judge_probed(self, now: float) -> None:
        """A probed peer that answered lives (a child then gets the result if it still lacks
        it); one silent for its RTO is reported."""
        watch = self.courier.watch
        for peer, at in list(self.probed.items()):
            if peer in self.scope.down:
                del self.probed[peer]  # the fleet knows already (its Will, the witnesses)
            elif self._shown_life(peer, at):
                del self.probed[peer]
                if peer in self.scope.children and not self.fan_acked.get(peer):
                    self._copy_when_due(peer, now)
            elif now >= self._verdict_at(peer, at):
                del self.probed[peer]
                watch.report_silent(peer, "no ACK of the fan-out, no answer to a probe", now)

    def _probe_below(self, lost: int, now: float) -> None:
        """The nodes under ``lost`` (a child that ACKed none of the result) ACK the fan-out to
        it, so if it is gone their silence shows nowhere in this round: each is probed with
        it (a few bytes; one RTO sooner than after its verdict). A leaf cut off together with
        its parent after it sent its data (the result counts it) is found silent in this
        round, instead of by the next round's wait for its data (a silence span and a grace
        more)."""
        scope = self.scope
        rtt = scope.links.measured_rtt(lost)
        for node in sorted(scope.tree.subtree(lost) - {lost, scope.node}):
            if node in scope.down or node in self.probed:
                continue
            if rtt is not None and not scope.links.is_measured(node):
                # A link we never used: its round trip crosses the same broker as the one to
                # ``lost`` did, not the initial guess (0.5 s).
                scope.links.observe(node, rtt)
            self._probe(node, now)

    def reconnected(self) -> None:
        if self.scope.parent is None:
            for ch in self.results.chunks:
                if ch.final_frame is not None:
                    self.scope.out.fanout(ch.final_frame)
