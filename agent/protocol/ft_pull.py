"""Asking for one FT-tree round's result when it does not come (PULL), and answering such
asks: with the result, later when we have it, or with word that this round has none here
(NACK|FINAL, after its root went down)."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import replace

from agent.protocol.allreduce import frame_size
from agent.protocol.answer_budget import AnswerBudget, padded
from agent.protocol.ft_broadcast import ResultBook
from agent.protocol.ft_courier import Courier
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.notes import NoteKind
from agent.protocol.wire import Flag, Frame, Kind, RejectReason

# Copies of one result chunk a peer's PULLs get from us in a round: its ask and one more (the
# answer lost on a lossy link); past that it asks the next peer of its chain.
PULL_ANSWERS_PER_CHUNK = 2


class PullAnswer(enum.Enum):
    ANSWERED = "answered"  # sent, promised for when we have it, or said there is none
    OVER_BUDGET = "over_budget"  # that peer had its copies of this chunk this round: refused
    UNPAID = "unpaid"  # beyond AMPLIFICATION x the bytes that peer sent us this round: refused


class ResultPull:
    def __init__(self, scope: RoundScope, results: ResultBook, courier: Courier) -> None:
        self.scope, self.results, self.courier = scope, results, courier
        cfg, parent = scope.cfg, scope.parent
        # When we ask next (None: nobody to ask, or the result is in).
        self.at: float | None = None if parent is None else (
            scope.start_time + cfg.round_deadline * cfg.reduce_fraction + cfg.pull_timeouts * scope.rto(parent))
        self.chain = self._chain()
        self.asked = 0
        self.root_gone_at: float | None = None  # the root's Will came; our parent was asked
        self.waiters: dict[int, set[int]] = {}  # chunk -> peers that asked before we had it
        self.no_result_for: dict[int, list[int]] = {}  # peer -> chunks it asked for that we skipped
        self.no_result: set[int] = set()  # chunks our parent or the root says have no result
        self.answered: Counter[tuple[int, int]] = Counter()  # (peer, chunk) -> copies sent for its PULLs
        self.budget = AnswerBudget()  # this round's bytes from each peer against our answers
        self.parent_asked_at: float | None = None  # asked our parent straight: its result came around us

    def _chain(self) -> list[int]:
        scope = self.scope
        if scope.parent is None:
            return []
        chain = [*scope.tree.backups(scope.node), *scope.tree.ancestors(scope.node)[1:], scope.parent]
        return list(dict.fromkeys(chain))

    def soon(self, due: float) -> None:
        """Ask no later than ``due``."""
        if self.at is not None:
            self.at = min(self.at, due)

    def pull(self, now: float) -> None:
        """Ask the next live peer of the chain for what we lack."""
        scope = self.scope
        missing = self.results.missing()
        live = [p for p in self.chain if p not in scope.down]
        if scope.parent in scope.down:
            # Our siblings wait for the same parent: its parent has the result (a sibling is
            # first only for a cut link of ours, with the parent alive).
            ancestors = scope.tree.ancestors(scope.node)
            live.sort(key=lambda p: p not in ancestors)
        if not missing or not live:
            self.at = None
            return
        live = self._own_site_first(live)
        peer = live[self.asked % len(live)]
        self.asked += 1
        scope.out.note(NoteKind.PULL, peer, f"{len(missing)} chunks")
        self.send_pull(peer, now)

    def _own_site_first(self, live: list[int]) -> list[int]:
        """Below a site's root, only peers of our own site while one of them lives: an answer
        from elsewhere crosses the uplinks, a whole result per ask, behind the fan-out it
        overtakes nowhere (after a bridge cut healed, 21 agents pulled 100-200 times a round
        across them: 40-150 MB a round where 11 do)."""
        tree, node = self.scope.tree, self.scope.node
        mine = tree.site(node)
        if not mine or tree.site_root(node) == node:
            return live
        own = [p for p in live if tree.site(p) == mine]
        return own or live

    def ask_parent(self, now: float) -> None:
        """Our parent's result came through a backup we never made a carrier (refused: a
        sibling could say so of any result): our parent went around a link to us it holds
        dead, while ours to it works. Ask it straight, once per its RTO (it answers each chunk
        twice a round at most); it answers straight. Before, the refused copy went unACKed,
        our parent rerouted it again and again, and we waited for our pull timer (issue 54.3's
        carriers under loss: twice the reroutes)."""
        scope, parent = self.scope, self.scope.parent
        if parent is None or not self.results.missing() or parent in scope.down:
            return
        if self.parent_asked_at is not None and now < self.parent_asked_at + scope.rto(parent):
            return
        self.parent_asked_at = now
        self.scope.out.note(NoteKind.PULL, parent, "its result came around us")
        # Our pull timer stays as it was: armed now, it would ask a backup next, the very
        # sibling that may have forged this (and its answer would count).
        self._ask(parent)

    def send_pull(self, peer: int, now: float) -> None:
        """Ask ``peer`` for the chunks whose result we lack; ask again after its RTO."""
        scope = self.scope
        self._ask(peer)
        # A sibling's link carries nothing in a healthy round, so it is never measured: count
        # on our parent's (the same broker's round trip), not the initial timeout. Half a
        # second per sibling asked kept the children of a frozen parent waiting (issue 12).
        measured = scope.links.is_measured(peer) or scope.parent is None
        self.at = now + scope.rto(peer if measured else scope.parent)

    def _ask(self, peer: int) -> None:
        scope = self.scope
        missing = self.results.missing()
        pull = Frame(Kind.PULL, scope.cfg.job, scope.round, scope.node, 0, scope.n, Flag.BROADCAST)
        asked = pull.with_indices([] if len(missing) == scope.n else missing)
        scope.out.send(peer, padded(asked, scope.result_bytes(missing)))
        scope.stats.pulls += 1
        scope.carriers.add(peer)  # asked by us: its answer is a result we may take

    def answer(self, j: int, peer: int, now: float, skipped: bool, over: bool, asked: bool = False) -> PullAnswer:
        """Chunk ``j``'s result to ``peer``: now, or when we have it (not after the deadline);
        or, when this round ended here without one (``skipped``), that it has none. Every
        copy is paid for by the bytes ``peer`` sent us this round (answer_budget.py);
        ``asked``: by a PULL, within the peer's copies of the chunk for the round, too."""
        ch = self.results[j]
        sent = self.courier.pending.get((True, j, peer))
        if (ch.final is not None and sent is not None and sent.route.kind == Hop.DIRECT
                and now - sent.sent_at < sent.timeout):
            return PullAnswer.ANSWERED  # our broadcast to it left just now (resends follow): not a second copy
        # (Sent around it, through a backup: it refuses that copy unless it routed so itself,
        # and its ask came straight, so the answer goes straight: ``ask_parent``.)
        if ch.final_frame is not None:
            # A ~50-byte PULL got the whole 1.63 MB result every time (1.24 MB of pulls cost
            # their victims 12.4 GB): its ask and one more copy (a lost answer), paid for.
            if asked and self.answered[(peer, j)] >= PULL_ANSWERS_PER_CHUNK:
                return PullAnswer.OVER_BUDGET
            verdict = self._send_paid(peer, replace(ch.final_frame, target=peer))
            if asked and verdict is PullAnswer.ANSWERED:
                self.answered[(peer, j)] += 1
            return verdict
        elif skipped:
            self.no_result_for.setdefault(peer, []).append(j)
        elif not over:
            self.waiters.setdefault(j, set()).add(peer)
        return PullAnswer.ANSWERED

    def earned(self, frame: Frame) -> None:
        """A frame of this round from its sender: its bytes pay for answers to it."""
        self.budget.earn(frame.sender, frame_size(frame))

    def _send_paid(self, peer: int, answer: Frame) -> PullAnswer:
        """``answer`` to ``peer`` if the bytes it sent us this round pay for it."""
        if not self.budget.spend(peer, frame_size(answer)):
            return PullAnswer.UNPAID
        self.scope.out.send(peer, answer)
        return PullAnswer.ANSWERED

    def send_no_result(self) -> None:
        """One NACK|FINAL per asking peer: "this round has no result for these chunks"."""
        scope = self.scope
        for peer, chunks in self.no_result_for.items():
            notice = scope.frame(Kind.NACK, 0, Flag.BROADCAST | Flag.FINAL, frozenset(), target=peer)
            scope.out.send(peer, notice.with_indices(sorted(set(chunks))))
        self.no_result_for.clear()

    def tell_skipped(self, skipped: list[int]) -> None:
        """Who asked us for a chunk we now skip is told at once (it waits for nothing)."""
        for j, waiters in self.waiters.items():
            if j in skipped:
                for peer in waiters:
                    self.no_result_for.setdefault(peer, []).append(j)
        self.send_no_result()

    def serve_waiters(self, j: int, frame: Frame, broadcast: list[int]) -> None:
        """Chunk ``j``'s result is here: to whoever asked for it. A puller we broadcast to
        anyway gets it once (with its ACK and resends), not twice; one whose parent lives gets
        it from there (it pulls again if its link is cut)."""
        for peer in sorted(self.waiters.pop(j, set()) - set(broadcast)):
            if (not self.results.its_parent_sends_it(peer)
                    and self._send_paid(peer, replace(frame, target=peer)) is PullAnswer.UNPAID):
                self.scope.stats.refused[RejectReason.PULL_UNPAID] += 1

    def no_result_said(self, frame: Frame, running: bool) -> bool:
        """A NACK|FINAL: our parent or the root ended this round without a result for the
        chunks it lists, so they have none anywhere, and we skip them as it did instead of
        pulling to the deadline (only those two could send us the result, so only they may
        say it has none). True: no chunk is left that might still get one; skip the rest."""
        scope = self.scope
        if not running or frame.sender not in (scope.parent, scope.tree.root):
            scope.stats.dropped += 1
            return False
        for j in frame.indices():
            if 0 <= j < scope.n and not self.results.has(j):
                self.no_result.add(j)
        if not all(self.results.has(j) or j in self.no_result for j in range(scope.n)):
            return False
        scope.out.note(NoteKind.ROOT_DOWN, scope.tree.root, f"no result, says {frame.sender}")
        return True

    def root_down(self, now: float) -> bool:
        """The root went down: nobody can average this round any more. Chunks without the
        root's result are skipped (nothing applied), the same on every survivor, so their
        models stay identical; a survivor that got a chunk the others lack is caught by the
        next root's model hash and resyncs. But the root may have broadcast before it went: a
        live parent that got the result passes it on, so ask it once (it answers with the
        result or that there is none) before skipping; one pull timeout at most. True: skip
        the chunks without a result now."""
        scope, parent, root = self.scope, self.scope.parent, self.scope.tree.root
        if parent is None or parent == root or parent in scope.down or self.root_gone_at is not None:
            scope.out.note(NoteKind.ROOT_DOWN, root)
            return True
        self.root_gone_at = now
        scope.out.note(NoteKind.ROOT_DOWN, root, f"asking {parent} for the result")
        self.send_pull(parent, now)
        return False
