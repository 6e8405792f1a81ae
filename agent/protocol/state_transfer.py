"""Full training-state transfer for a (re)joining, drifted or lagging node, over MODEL_PULL/MODEL.

The state is an opaque float32 vector (parameters + optimizer state, laid out by the runtime).
A node asks two live peers for a stripe each of the state at the start of round ``round``
(MODEL_PULL, payload = chunk indices, empty = all). A peer answers, once it has reached that
round, with MODEL chunks labelled with the round whose start state they hold and the state's
hash (``serve_model_pull``); the puller takes the state only when both stripes meet at one
round and hash to what both peers vouched for, tries the next pair of peers (for a newer
round) when a peer stays silent for ``timeout`` or a stripe is forged, and ends with (round,
state, state hash). The puller installs the state at a
round boundary, so it continues byte-identical with the fleet. ``resync_reason`` says when a
member must fetch the fleet's state after a round. Pure: frames and ``now`` in, actions out.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Collection, Mapping

import numpy as np

from agent.protocol.allreduce import Action, Note, RoundResult, Send, chunk_bounds
from agent.protocol.answer_budget import asked_indices, padded, values_frame_bytes
from agent.protocol.notes import NoteKind
from agent.protocol.wire import DType, Flag, Frame, Kind, value_bytes

# Values per MODEL frame when the runtime serves its state (256 KiB of float32).
STATE_CHUNK_VALUES = 1 << 16
# Peers a state is fetched from at once, one stripe each: each vouches for the state's hash.
STATE_STRIPES = 2
# A state may be labelled this many rounds past the one asked for, plus MAX_ROUND_RATE rounds
# for every second since that round was known to be the fleet's (a peer serves the state of
# the round it is in, and the fleet goes on while we fetch, or went on since our checkpoint).
# A label further on is no round the fleet can be in: a peer's lie that would have us ask
# everybody for a round nobody reaches.
STATE_AHEAD_SLACK = 8
MAX_ROUND_RATE = 100.0


def state_hash(values: np.ndarray) -> int:
    """The state's hash: BLAKE2b over its float32 bytes, cut to the frame header's 32 bits.
    Unlike a CRC (linear: 4 changed bytes gave finite wrong values the honest CRC), finding
    other values with a given hash costs ~2^32 BLAKE2b evaluations of the chunks from the
    changed one to the end of the state (docs/SECURITY.md)."""
    data = np.ascontiguousarray(values, dtype="<f4").data.cast("B")
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")


# Bytes of a state's full digest, announced per round (``StateDigest``) and checked by a
# joiner before it installs a state: the header's 32 bits only stop a peer that cannot spend
# ~2^32 hashes; a 128-bit digest stops any.
STATE_DIGEST_BYTES = 16


def state_digest(values: np.ndarray) -> str:
    """The state's full digest: BLAKE2b-128 over its float32 bytes, as hex."""
    data = np.ascontiguousarray(values, dtype="<f4").data.cast("B")
    return hashlib.blake2b(data, digest_size=STATE_DIGEST_BYTES).hexdigest()


class Vouch(enum.Enum):
    """Whether the fleet announced a fetched state's digest for its round (``vouch``)."""

    VOUCHED = "vouched"  # the coordinator, or a majority of the view, announced it: install
    DISPUTED = "disputed"  # the coordinator (or a majority) announced another: refuse
    UNANNOUNCED = "unannounced"  # nobody who decides announced that round yet: wait


def vouch(digest: str, announced: Mapping[int, str], members: Collection[int],
          coordinator: int | None) -> Vouch:
    """Whether a state of digest ``digest`` is the fleet's, given the digests ``announced``
    for its round (node -> digest), the view's ``members`` (the joiner left out) and the
    ``coordinator`` (None: none that could have announced). The peers that sent a state
    vouch for it in the header, which one device can fake for its stripe or, alone, for
    all; only the coordinator or a majority of the view can make a state the fleet's."""
    voters = set(members)
    counts: dict[str, int] = {}
    for node in voters:
        if node in announced:
            counts[announced[node]] = counts.get(announced[node], 0) + 1
    if (coordinator is not None and announced.get(coordinator) == digest) or 2 * counts.get(digest, 0) > len(voters):
        return Vouch.VOUCHED
    if coordinator is not None and coordinator in announced:
        return Vouch.DISPUTED
    if any(2 * n > len(voters) for d, n in counts.items() if d != digest):
        return Vouch.DISPUTED
    return Vouch.UNANNOUNCED


class StateLabel(enum.Enum):
    """A MODEL frame's round against the transfer's."""

    USABLE = "usable"
    OLD = "old"  # a late answer to an earlier transfer or a burnt round
    BEYOND_FLEET = "beyond_fleet"  # a round the fleet cannot be in yet


def judge_label(label: int, floor: int, asked: int, elapsed: float) -> StateLabel:
    """A state labelled ``label`` for a transfer that asked for round ``asked`` ``elapsed``
    seconds ago and takes no round before ``floor``."""
    if label < floor:
        return StateLabel.OLD
    if label > asked + STATE_AHEAD_SLACK + MAX_ROUND_RATE * max(0.0, elapsed):
        return StateLabel.BEYOND_FLEET
    return StateLabel.USABLE


def resync_reason(result: RoundResult, own_hash: int) -> str | None:
    """Why this node's model no longer equals the fleet's after ``result``, or None.

    Chunks that fell back to the local value were applied as our own gradient, not the
    fleet's mean; a root hash unlike ours means we started the round from another model.
    """
    if result.missing_chunks:
        return f"{len(result.missing_chunks)} chunks fell back to the local value"
    if result.root_model_hash is not None and result.root_model_hash != own_hash:
        return f"{own_hash:08x} != root {result.root_model_hash:08x}"
    return None


def serve_model_pull(
    request: Frame, node: int, job: int, state: np.ndarray, round: int, chunk_size: int,
    chunks: list[int] | None = None,
) -> list[Send]:
    """MODEL frames answering ``request`` with ``state`` (the state at the start of ``round``):
    the chunks it asks for, or ``chunks`` when given. Every frame carries the whole state's
    hash, which the puller checks against the assembled values and the other stripe's."""
    state = np.asarray(state, dtype=np.float32)  # the copy must be exact: always float32
    bounds = chunk_bounds(len(state), chunk_size)
    wanted = chunks if chunks is not None else (asked_indices(request) or list(range(len(bounds))))
    digest = state_hash(state)
    out: list[Send] = []
    for j in wanted:
        if not 0 <= j < len(bounds):
            continue
        lo, hi = bounds[j]
        frame = Frame(Kind.MODEL, job, round, node, j, len(bounds), Flag.NONE,
                      target=request.sender, model_hash=digest)
        out.append(Send(request.sender, frame.with_values(state[lo:hi])))
    return out


def state_chunk_count(size: int, chunk_values: int) -> int:
    """MODEL frames of a state of ``size`` values (the same on every agent of a job)."""
    return max(1, -(-size // chunk_values))


def state_frame_bytes(size: int, chunk_values: int, j: int) -> int:
    """Bytes of the MODEL frame of chunk ``j`` of a state of ``size`` values."""
    lo = j * chunk_values
    return values_frame_bytes(max(0, min(size, lo + chunk_values) - lo), value_bytes(DType.F32))


class StateTransfer:
    """Fetch the state at the start of ``round`` (or a later one) from ``peers``.

    The state is fetched in ``STATE_STRIPES`` stripes (chunk j in stripe j mod stripes), each
    from another peer, so no peer serves all of it and every state is vouched for by two
    peers: it is taken only when every chunk's header carries one hash, the assembled values
    hash to it, and two distinct peers sent it (one, when there is only one peer). A peer's
    word alone never installs a state.

    Within a round each peer is asked once: a stripe whose peer stays silent for ``timeout``
    is asked of a peer not asked yet (a peer still behind that round answers on reaching it);
    a forged or corrupt stripe (the hashes disagree) is dropped with the other stripe of its
    pair, and a fresh pair is asked for the same round (none left: the next round, from the
    next pair). So one liar delays a transfer, never poisons it. MODEL frames from a peer not
    asked for that chunk (or whose stripe was dropped) are refused. ``size``, when given, is the
    state's length.

    The ``anchor`` is the coordinator, whose model is the fleet's reference: in a dispute its
    stripe is kept and the other asked of a peer not asked yet. ``anchor_decides`` (a drifted
    member's resync): the anchor is in every pair, and in a dispute it is asked for its whole
    state and its word alone is taken; after a fault that made many members drift at
    once no two peers may agree, and without it the fleet never converged again. The anchor
    sends more than a stripe only when others pull from it too (see the core); otherwise the
    rest is asked, after the timeout, of peers not asked yet.
    """

    def __init__(self, node: int, job: int, round: int, peers: list[int], timeout: float,
                 now: float, size: int | None = None, chunk_values: int = STATE_CHUNK_VALUES,
                 anchor: int | None = None, anchor_decides: bool = False, since: float | None = None) -> None:
        if not peers:
            raise ValueError("a state transfer needs at least one peer")
        self.node, self.job, self.round = node, job, round
        self.peers = list(peers)
        self.timeout = timeout
        self.size, self.chunk_values = size, chunk_values
        self.count = state_chunk_count(size, chunk_values) if size is not None else None
        # Distinct peers that must vouch for a state (stripes need the chunk count).
        self.needed = min(STATE_STRIPES, len(self.peers), self.count) if self.count is not None else 1
        # The reference peer (the coordinator, whose model the fleet's drift is measured
        # against): in a dispute its stripe is kept and the other one asked of another peer.
        self.anchor = anchor
        self.anchor_decides = anchor_decides and anchor is not None
        self.peer_i = 0  # rotation: where the next peers asked come from
        self.last_asked = self.peers[0]
        self.target = round  # the round whose state we assemble
        self.floor = round  # older MODEL frames answer a burnt round
        self.last_progress = now
        self.asked_in: dict[int, set[int]] = {}  # round -> peers asked for it
        self.assigned: dict[int, set[int] | None] = {}  # peer -> chunks asked of it (None: all)
        self.parts: dict[int, dict[int, tuple[int, int, np.ndarray]]] = {}  # round -> chunk -> (sender, hash, values)
        self.attempts = 0
        # When ``round`` was last known to be the fleet's: a joiner restarted from a
        # checkpoint asks for the checkpoint's round, and the fleet went on since.
        self.round_known_at = now if since is None else min(since, now)
        self.result: tuple[int, np.ndarray, int] | None = None  # (round, state, state hash)

    @property
    def peer(self) -> int:
        """The peer asked last (named in notes)."""
        return self.last_asked

    def start(self, now: float) -> list[Action]:
        return self._ask_round(now)

    def _ask_round(self, now: float) -> list[Action]:
        """Every stripe of ``self.target``'s state, each from a peer not asked for it yet."""
        self.attempts += 1
        self.last_progress = now
        out: list[Action] = []
        for stripe in range(self.needed):
            out += self._ask_chunks(self._stripe(stripe))
        return [Note(NoteKind.STATE_PULL, self.peer, f"attempt {self.attempts}"), *out]

    def _fresh_peer(self) -> int | None:
        asked = self.asked_in.setdefault(self.target, set())
        if self.anchor_decides and self.anchor in self.peers and self.anchor not in asked:
            # A drifted member's every pair has the reference in it: after a broker restart
            # a pair of drifted peers disagreed, which cost a round, or, drifted alike,
            # agreed on a model that was not the fleet's. Joiners rotate: in every pair of
            # many joiners at once the coordinator falls behind its own rounds.
            self.last_asked = self.anchor
            return self.anchor
        for _ in range(len(self.peers)):
            peer = self.peers[self.peer_i % len(self.peers)]
            self.peer_i += 1
            if peer not in asked:
                self.last_asked = peer
                return peer
        return None

    def _ask_chunks(self, chunks: list[int]) -> list[Action]:
        """Ask a peer not asked for this round yet for ``chunks`` (empty: all of them)."""
        peer = self._fresh_peer()
        if peer is None:
            return []
        self.asked_in[self.target].add(peer)
        return [self._pull(peer, chunks)]

    def _pull(self, peer: int, chunks: list[int]) -> Send:
        """MODEL_PULL of ``chunks`` (empty: all) of the target round, which ``peer`` may then send."""
        self.assigned[peer] = None if not chunks else (self.assigned.get(peer) or set()) | set(chunks)
        ask = Frame(Kind.MODEL_PULL, self.job, self.target, self.node, 0, 1).with_indices(chunks)
        return Send(peer, ask if self.size is None else padded(ask, self._answer_bytes(chunks)))

    def _answer_bytes(self, chunks: list[int]) -> int:
        """Bytes of the MODEL frames answering a pull of ``chunks`` (empty: all): what the
        pull pays for (answer_budget.py)."""
        assert self.size is not None and self.count is not None
        wanted = chunks or range(self.count)
        return sum(state_frame_bytes(self.size, self.chunk_values, j) for j in wanted)

    def _stripe(self, stripe: int) -> list[int]:
        """Chunk indices of one stripe (empty = all: a single peer, or the count unknown)."""
        if self.needed == 1 or self.count is None:
            return []
        return [j for j in range(self.count) if j % self.needed == stripe]

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        if self.result is not None or not self._wanted(frame):
            return []
        if judge_label(frame.round, self.floor, self.round, now - self.round_known_at) is StateLabel.BEYOND_FLEET:
            return [Note(NoteKind.STATE_BEYOND_FLEET, frame.sender, f"round {frame.round}, asked {self.round}")]
        if frame.sender not in self.assigned or not _in_stripe(frame.chunk_index, self.assigned[frame.sender]):
            return [Note(NoteKind.STATE_UNASKED, frame.sender, f"chunk {frame.chunk_index} of round {frame.round}")]
        if self.count is not None and frame.chunk_count != self.count:
            return [Note(NoteKind.STATE_REJECTED, frame.sender, f"{frame.chunk_count} chunks, expected {self.count}")]
        parts = self.parts.setdefault(frame.round, {})
        parts[frame.chunk_index] = (frame.sender, frame.model_hash, frame.values())
        self.last_progress = now
        out = self._follow(frame.round)
        if len(parts) < frame.chunk_count:
            return out
        return out + self._assemble(frame.round, frame.chunk_count, now)

    def _follow(self, round: int) -> list[Action]:
        """A stripe answered with a newer round than we asked (its peer was past it): ask for
        the other stripes of that round, so the stripes meet at one state. The anchor asked
        for its whole state sends all of that round's itself."""
        if round <= self.target:
            return []
        self.target = round
        for old in [r for r in self.parts if r < round - 1]:
            del self.parts[old]
        parts = self.parts[round]
        answered = {sender for sender, _, _ in parts.values()}
        self.asked_in.setdefault(round, set()).update(answered)
        if self._anchor_sends_all() and answered == {self.anchor}:
            return []
        out: list[Action] = []
        for stripe in range(self.needed):
            chunks = self._stripe(stripe)
            if not any(j in parts for j in chunks or [0]):
                out += self._ask_chunks(chunks)
        return out

    def _anchor_sends_all(self) -> bool:
        """After a dispute: the anchor was asked for its whole state."""
        return self.anchor_decides and self.anchor in self.assigned and self.assigned[self.anchor] is None

    def _assemble(self, round: int, count: int, now: float) -> list[Action]:
        parts = self.parts[round]
        if any(j not in parts for j in range(count)):
            return []  # chunks of another count (a liar's) are no whole state
        senders = {sender for sender, _, _ in parts.values()}
        hashes = {h for _, h, _ in parts.values()}
        state = np.concatenate([parts[j][2] for j in range(count)]).astype(np.float32)
        why = None
        if self.size is not None and state.size != self.size:
            why = f"{state.size} values, expected {self.size}"
        elif len(hashes) != 1 or state_hash(state) not in hashes:
            if self.anchor in senders:
                return self._keep_anchor(round, now)
            why = "the stripes do not hash to what their peers vouched for"
        elif len(senders) < self.needed and not (self.anchor_decides and senders == {self.anchor}):
            return []  # both stripes from one peer (asked again alone): wait for another's
        if why is not None:
            return self.reject(why, now, sorted(senders))
        del self.parts[round]
        self.result = (round, state, hashes.pop())
        return [Note(NoteKind.STATE_RECEIVED, min(senders), f"round {round} from {sorted(senders)}")]

    def _keep_anchor(self, round: int, now: float) -> list[Action]:
        """A dispute with the anchor in it: the chunks vouched for with another hash than the
        anchor's are dropped (their peer's frames refused from now on) and asked of a peer
        not asked for this round yet (none left: the next round)."""
        parts = self.parts[round]
        anchor_hash = next(h for sender, h, _ in parts.values() if sender == self.anchor)
        wrong = sorted(j for j, (_, h, _) in parts.items() if h != anchor_hash)
        if not wrong:
            # Every chunk claims the anchor's hash, yet the values do not hash to it: the
            # chunks of someone else are forged (or the anchor's own, when it sent them all).
            wrong = sorted(j for j, (sender, _, _) in parts.items() if sender != self.anchor)
            if not wrong:
                senders = sorted({sender for sender, _, _ in parts.values()})  # the anchor alone
                return self.reject("the anchor's state does not hash to what it vouched for", now, senders)
        liars = sorted({parts[j][0] for j in wrong})
        for j in wrong:
            del parts[j]
        for peer in liars:
            self.assigned.pop(peer, None)
        note = Note(NoteKind.STATE_REJECTED, liars[0], f"{len(wrong)} chunks unlike the reference's")
        if self.anchor_decides:
            return [note, *self._ask_anchor(now)]
        if len(self.peers) - len(self.asked_in.get(self.target, set())) < 1:
            return [note, *self._next_round(now)]
        self.last_progress = now
        return [note, *self._ask_chunks(wrong)]

    def _ask_anchor(self, now: float) -> list[Action]:
        """A dispute: the anchor is asked for its whole state. Within its round it sends the
        rest (each chunk once per puller and round); past it, all of a newer round's, a state
        by itself. Asked for the rest only, the rest came of a round the other stripe was
        not of whenever the anchor had moved on, and on a loaded host the stripes chased each
        other round after round (the broker-restart test)."""
        assert self.anchor is not None
        self.last_progress = now
        return [self._pull(self.anchor, [])]

    def _wanted(self, frame: Frame) -> bool:
        """MODEL frames of our job holding an exact copy of a state as new as the one we asked
        for (older ones are late answers to an earlier transfer or a burnt round)."""
        return (frame.kind == Kind.MODEL and frame.job == self.job and frame.dtype == DType.F32
                and frame.round >= self.floor)

    def reject(self, why: str, now: float, senders: list[int] | None = None) -> list[Action]:
        """The assembled state is unusable: its stripes are dropped and their peers' further
        frames refused; the same round is asked of peers not asked for it yet (after the
        fleet's last round there is no next one), or, too few left, the next round."""
        self.result = None
        blamed = senders or [self.peer]
        for peer in blamed:
            self.assigned.pop(peer, None)
        self.parts.pop(self.target, None)
        note = Note(NoteKind.STATE_REJECTED, blamed[0], why)
        if len(self.peers) - len(self.asked_in.get(self.target, set())) >= self.needed:
            return [note, *self._ask_round(now)]
        return [note, *self._next_round(now)]

    def _next_round(self, now: float) -> list[Action]:
        self.target = self.floor = max([self.target, *self.parts]) + 1
        self.parts.clear()
        return self._ask_round(now)

    def next_timer(self) -> float | None:
        return None if self.result is not None else self.last_progress + self.timeout

    def retry_now(self, now: float) -> list[Action]:
        """Our connection dropped and came back: what we asked, or were sent, is lost. Act as
        if the timeout had passed (without it, the transfer waited a whole one)."""
        self.last_progress = min(self.last_progress, now - self.timeout)
        return self.on_timer(now)

    def on_timer(self, now: float) -> list[Action]:
        """Silence: the stripes still missing are asked of peers not asked for this round yet
        (none left: every peer holds our pull, answered as it reaches the round)."""
        if self.result is not None or now < self.last_progress + self.timeout:
            return []
        parts = self.parts.get(self.target, {})
        missing = self._missing_stripes(parts)
        silent = sorted({p for p in self.asked_in.get(self.target, set())
                         if not any(sender == p for sender, _, _ in parts.values())})
        notes: list[Action] = [Note(NoteKind.TIMEOUT, p, "state transfer") for p in silent] or [Note(NoteKind.TIMEOUT, None, "state transfer")]
        self.attempts += 1
        self.last_progress = now
        fresh = len(self.peers) - len(self.asked_in.get(self.target, set()))
        if fresh < len(missing):
            return notes  # every peer has our pull: it is answered when they reach the round
        out = list(notes)
        for chunks in missing:
            out += self._ask_chunks(chunks)
        return out

    def _missing_stripes(self, parts: dict[int, tuple[int, int, np.ndarray]]) -> list[list[int]]:
        """The chunks not here yet of every incomplete stripe ([] = all of a state whose chunk
        count is unknown)."""
        if self.count is None:
            return [[]]
        lacking = ([j for j in (self._stripe(s) or range(self.count)) if j not in parts]
                   for s in range(self.needed))
        return [chunks for chunks in lacking if chunks]


def _in_stripe(chunk: int, stripe: set[int] | None) -> bool:
    return stripe is None or chunk in stripe
