"""The reduce's way up from one node of an FT-tree round: each chunk's partial mean to the
parent as soon as the chunk is ready (later units follow as disjoint supplements), in the wire
format its links fit, by routes that go around a dead link (relay through the backups, then
straight to further ancestors, finally a flood)."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import WAITING_EVERY
from agent.protocol.ft_courier import Courier, Pending, Route
from agent.protocol.ft_reducer import ChunkReducer
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.wire import DType, Flag, Frame, Kind
from agent.protocol.wire_choice import choose, choose_for_own_link, narrowest

AUDIT_DTYPE = DType.I8  # the audit copies' wire format (see Uplink.send_audit_copy)


class Uplink:
    def __init__(self, scope: RoundScope, reducer: ChunkReducer, courier: Courier) -> None:
        self.scope, self.reducer, self.courier = scope, reducer, courier
        self.beat_at: float | None = None  # when we next tell our parent we are in the round

    def start_beats(self, now: float) -> None:
        """A node with children tells its parent every WAITING_EVERY that it waits for them
        (see WAITING_EVERY); a leaf's data goes up at once."""
        scope = self.scope
        if scope.adaptive and scope.children and scope.parent is not None:
            self.beat_at = now + WAITING_EVERY

    def beat(self, now: float, has_result: bool) -> None:
        scope, parent = self.scope, self.scope.parent
        if self.beat_at is None or now < self.beat_at:
            return
        if has_result or parent is None or parent in scope.down:
            self.beat_at = None
            return
        scope.out.send(parent, scope.frame(Kind.PROBE, 0, Flag.WAITING, frozenset(), target=parent))
        self.beat_at = now + WAITING_EVERY

    def forward(self, j: int, now: float, ready: bool) -> None:
        """Chunk ``j``'s units not sent up yet, once the chunk is ``ready`` (or opened)."""
        if not self.reducer.first_sent(j) and not ready:
            return
        unit = self.reducer.take_unsent(j)
        if unit is not None:
            self.send(j, unit[0], unit[1], now, audit_copy=True)

    def send(self, j: int, ids: frozenset[int], mean: np.ndarray, now: float, audit_copy: bool = False) -> None:
        scope, parent = self.scope, self.scope.parent
        assert parent is not None
        if audit_copy:
            self.send_audit_copy(j, ids, mean)  # first: it is to be there before our parent's unit
        frame = scope.frame(Kind.DATA, j, Flag.NONE, ids).with_values(mean, self.wire_dtype(parent, j))
        self.courier.send(Pending(False, j, parent, ids, frame, self._routes(parent), cycle=True), now)

    def send_audit_copy(self, j: int, ids: frozenset[int], mean: np.ndarray) -> None:
        """The unit we send up, once to our grandparent as well, in int8 (a quarter of a
        float32 unit; 2-9 % error on the unit's norm, measured on the thesis MLP's gradients,
        against a member's bound of 3 medians): with it, it takes our parent's unit apart
        (audit.py). Sent once, never ACKed: a lost copy leaves that unit unaudited, as before."""
        scope = self.scope
        ancestors = scope.tree.ancestors(scope.node)
        if not scope.cfg.audit_units or scope.ctx.influence is None or len(ancestors) < 2:
            return
        grandparent = ancestors[1]
        if grandparent not in scope.down:
            copy = scope.frame(Kind.DATA, j, Flag.AUDIT, ids).with_values(mean, AUDIT_DTYPE)
            scope.out.send(grandparent, copy)

    def wire_dtype(self, peer: int, j: int) -> DType:
        """The format of chunk ``j``'s values to ``peer``: with ``wire_auto``, the narrowest of
        what the link fits, what our own link fits and what the chunk's units came in."""
        cfg, size = self.scope.cfg, len(self.scope.grad)
        if not cfg.wire_auto:
            return cfg.wire_dtype
        fits = choose(size, self.scope.links.typical_rate(peer), cfg.wire_budget, cfg.wire_dtype)
        ours = choose_for_own_link(size, self.scope.ctx.own_link_rate, cfg.wire_dtype)
        return narrowest(narrowest(fits, ours), self.reducer.narrowest(j))

    def _routes(self, parent: int) -> list[Route]:
        tree, node = self.scope.tree, self.scope.node
        routes = [Route(Hop.DIRECT, parent, parent)]
        routes += [Route(Hop.RELAY, b, parent) for b in tree.backups(node)]
        routes += [Route(Hop.DIRECT, a, a) for a in tree.ancestors(node)[1:]]
        routes.append(Route(Hop.FLOOD, -1, parent))
        return routes

    def delivered(self) -> bool:
        """Every chunk went up and every unit up was ACKed."""
        return self.reducer.all_first_sent() and not self.courier.has_reduce_units()

    def resend_custody(self, now: float) -> None:
        """What the parent ACKed may be stuck in it now that it is down: send it again around
        it. The receiver refuses any overlap with what it already counted, so nothing is
        counted twice."""
        for j in range(self.scope.n):
            unit = self.reducer.sent_so_far(j)
            if unit is not None and (False, j, unit[0]) not in self.courier.pending:
                self.send(j, unit[0], unit[1], now)

    def tell_around(self, nack: Frame) -> None:
        """Our tree parent NACKed chunks whose units another aggregator ACKed (the parent was
        down for the fleet when we sent): say they went around it, or it waits for us as long
        as a first frame usually takes and the fleet waits for it (a flap of 80 ms: 0.27 s
        rounds against 0.05 s)."""
        scope = self.scope
        if scope.node not in scope.tree or nack.sender != scope.tree.parent(scope.node):
            return
        around = sorted(j for j in set(nack.indices()) if 0 <= j < scope.n and self.courier.went_around(j, nack.sender))
        units = [unit for j in around if (unit := self.reducer.sent_so_far(j)) is not None]
        if units:
            ids = frozenset().union(*(unit[0] for unit in units))
            ack = scope.frame(Kind.ACK, around[0], Flag.AROUND, ids, target=nack.sender)
            scope.out.send(nack.sender, ack.with_indices(around))

    def ask_children_again(self) -> None:
        """What a child sent us while we were away is lost and waits for its timeout (no ACK
        came): ask for it now. A child that went around us has nothing to resend."""
        scope = self.scope
        for child in scope.children:
            gaps = [j for j in range(scope.n) if child not in self.reducer.covered(j)]
            if gaps and child not in scope.down:
                nack = Frame(Kind.NACK, scope.cfg.job, scope.round, scope.node, 0, scope.n, Flag.NONE)
                scope.out.send(child, nack.with_indices(gaps))
