"""Serving the training state to members that pull it (joining, behind or drifted).

``StateServer`` keeps the pulls waiting for our round, what each puller got of each round's
state, and whom we told that it is behind. It decides what to send (``SendState``) and builds
the frames from the driver's state; the core says when our state is the one asked for. Pure:
no IO, no clock.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from agent.core.actions import AnnounceState, SendState
from agent.protocol.allreduce import Send, frame_size
from agent.protocol.answer_budget import AnswerBudget, asked_indices
from agent.protocol.membership import Membership
from agent.protocol.messages import StateDigest
from agent.protocol.state_transfer import (
    STATE_STRIPES,
    serve_model_pull,
    state_chunk_count,
    state_digest,
    state_frame_bytes,
)
from agent.protocol.wire import Flag, Frame, Kind, RejectReason


class StateServer:
    def __init__(self, node: int, job: int, state_size: int | None, chunk_values: int,
                 rejected: Counter[str], sole_source: bool = False) -> None:
        self.node, self.job = node, job
        self.sole_source = sole_source  # the coordinator's state alone is the fleet's (ps-async)
        self.state_size, self.chunk_values = state_size, chunk_values
        self.rejected = rejected
        self.pending: dict[int, Frame] = {}  # puller -> its MODEL_PULL
        self.served: dict[tuple[int, int], set[int]] = {}  # (puller, round) -> state chunks sent
        self.hinted: dict[int, int] = {}  # puller -> our round when we told it it is behind
        self.announced_round = -1  # the last round whose state digest we announced
        self.budget = AnswerBudget()  # each puller's pulls against the state it got, over the run

    def asked(self, request: Frame) -> None:
        """A MODEL_PULL came: answered as soon as we are at its round (``due``); its bytes pay
        for the answer (answer_budget.py)."""
        self.budget.earn(request.sender, frame_size(request))
        self.pending[request.sender] = request

    def due(self, round: int, membership: Membership, *, can_serve: bool, lingering: bool) -> list[SendState]:
        """Answer pullers that asked for a round we are at (or before) with our state, which is
        always "the state at the start of ``round``" (the core's state contract). Without a
        state of our own (``can_serve`` false: joining, connecting) their pulls wait for it:
        a site back from a cut pulls from its own members, which join with it."""
        out: list[SendState] = []
        if not can_serve:
            return out
        for puller, request in list(self.pending.items()):
            if request.round <= round:
                del self.pending[puller]
                limit = self._stripe_limit(puller, round, membership, lingering)
                chunks = self._share_for(puller, request, round, limit)
                if chunks == ():
                    continue  # nothing left for it this round (counted)
                out.append(SendState(request, round, chunks))
        return out

    def announcement(self, action: AnnounceState, state: np.ndarray) -> StateDigest | None:
        """The digest of ``state`` (ours at the start of ``action.round``) to announce; None
        when that round's was announced already."""
        if action.round <= self.announced_round:
            return None
        self.announced_round = action.round
        return StateDigest(self.node, action.round, state_digest(state))

    def frames(self, action: SendState, state: np.ndarray) -> list[Send]:
        """The MODEL frames answering ``action`` with ``state`` (the driver's current state)."""
        chunks = list(action.chunks) if action.chunks is not None else None
        return serve_model_pull(action.request, self.node, self.job, state, action.round,
                                self.chunk_values, chunks)

    def hint(self, frame: Frame, round: int, running: bool) -> Frame | None:
        """A peer pulls a round we no longer answer (it reconnected after the fleet went on
        without it): a probe of our round tells it how far behind it is, so it fetches the
        fleet's state now instead of waiting out that round's deadline. Once per round."""
        if frame.kind != Kind.PULL or self.hinted.get(frame.sender, -1) >= round or not running:
            return None
        self.hinted[frame.sender] = round
        return Frame(Kind.PROBE, self.job, round, self.node, 0, 1, Flag.NONE, target=frame.sender)

    def forget_before(self, round: int) -> None:
        """A new round starts: what pullers got of rounds before the last one is kept no longer."""
        self.served = {k: v for k, v in self.served.items() if k[1] >= round - 1}

    def _stripe_limit(self, puller: int, round: int, membership: Membership, lingering: bool) -> int | None:
        """A puller (joining, behind or drifted) asks each peer for one stripe, two peers
        vouching for a state, so it gets at most one stripe of this round's state from us
        (None: no limit). Otherwise a device that keeps asking for everything took a whole
        state from us every round: 2.5x the root's normal round, for as long as it liked.
        Whole states go out only when we are its only source, when the run is over (the
        final sync) or when another member pulls from us in this round too: a fault that made
        several members drift at once (a broker restart, a root that dropped mid-round) may
        leave no two peers agreeing, and then the reference's word (the coordinator's) alone
        resyncs them (StateTransfer's ``anchor_decides``). One device cannot show that alone."""
        if self.state_size is None or lingering or self._others_pull(puller, round):
            return None
        if self.sole_source and membership.coordinator() == self.node:
            return None  # the pullers' only source (see ``server_holds_the_state``)
        view = membership.views.view_for(round)
        sources = [m for m in (view.members if view is not None else [])
                   if m != puller and (m == self.node or membership.is_online(m))]
        if len(sources) < STATE_STRIPES:
            return None
        count = state_chunk_count(self.state_size, self.chunk_values)
        return -(-count // STATE_STRIPES)

    def _others_pull(self, puller: int, round: int) -> bool:
        """A member other than ``puller`` asked us for this round's state (served or due)."""
        due = {p for p, request in self.pending.items() if request.round <= round}
        served = {p for p, r in self.served if r == round}
        return bool((due | served) - {puller})

    def _share_for(self, puller: int, request: Frame, round: int, limit: int | None) -> tuple[int, ...] | None:
        """The state chunks ``puller`` gets of this round's state: what it asks for, less what
        it already got this round, so at most one state, and at most ``limit`` chunks in all
        (None: no state size to count with, the whole state once). () when nothing is left
        for it, counted: each chunk at most once per peer and round, so a pull flood costs
        the flooder, not us."""
        if self.state_size is None:
            first = (puller, round) not in self.served
            self.served.setdefault((puller, round), set())
            if not first:
                self.rejected["model_pull_repeat"] += 1
            return None if first else ()
        count = state_chunk_count(self.state_size, self.chunk_values)
        sent = self.served.setdefault((puller, round), set())
        fresh = tuple(j for j in (asked_indices(request) or range(count)) if 0 <= j < count and j not in sent)
        chunks = fresh if limit is None else fresh[: max(0, limit - len(sent))]
        if not chunks:
            self.rejected["model_pull_budget" if fresh else "model_pull_repeat"] += 1
        paid = self._paid(puller, chunks)
        sent.update(paid)
        return paid

    def _paid(self, puller: int, chunks: tuple[int, ...]) -> tuple[int, ...]:
        """The first of ``chunks`` that ``puller``'s pulls pay for (answer_budget.py): a
        ~60-byte pull was answered with a 1 MB chunk (a flood of them amplified ~7,000x).
        The rest is refused, counted; an honest puller pads its pull to pay for it all."""
        paid: list[int] = []
        for j in chunks:
            if not self.budget.spend(puller, state_frame_bytes(self.state_size or 0, self.chunk_values, j)):
                self.rejected[RejectReason.PULL_UNPAID] += 1
                break
            paid.append(j)
        return tuple(paid)
