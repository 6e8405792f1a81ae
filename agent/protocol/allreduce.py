"""The allreduce of one round, as pure state machines: ``ft-tree``, plain ``tree`` and ``rps``,
and the thesis's Figure 13 baselines ``ps-sync``, ``ps-async`` and ``ring``.

The agent core creates one machine per round with ``rounds.new_round`` and feeds
it frames and timer ticks; the machine answers with actions (``Send`` a frame, ``Note`` a
telemetry event) and, once it knows what to apply, sets ``result``. No IO, no clock: every
call gets ``now``.

Values travel as per-chunk subtree MEANS with their contributor sets, never bare sums, and a
contribution is counted at most once (``merge_means`` only ever merges disjoint sets).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from agent.protocol.influence import InfluenceBound
from agent.protocol.notes import NoteKind
from agent.protocol.plausibility import PlausibilityBook
from agent.protocol.ps_ledger import ServerLedger
from agent.protocol.rto import LinkEstimators
from agent.protocol.topology import Tree
from agent.protocol.wire import HEADER_SIZE, WIRE_NAMES, DType, Frame, Kind
from agent.protocol.wire_choice import AUTO_WIRE_BUDGET

# Values per chunk (1 MB frames in float32: the thesis model's 407,050 values in 2 chunks). Per
# message costs dominate on small devices and a shared host: measured with `bench
# round-profile` at 7, 15 and 31 agents, 262,144 beat 16,384, 65,536, 131,072 and one chunk
# (docs/PROFILE.md).
DEFAULT_CHUNK_VALUES = 262_144


class Algorithm(enum.StrEnum):
    """The allreduce a fleet runs; the value is its name on the command line and in telemetry."""

    FT_TREE = "ft-tree"
    TREE = "tree"
    RPS = "rps"
    PS_SYNC = "ps-sync"
    PS_ASYNC = "ps-async"
    RING = "ring"


TimeoutMode = Literal["adaptive", "fixed"]
ALGORITHMS: tuple[str, ...] = tuple(a.value for a in Algorithm)
# How ft-tree's root hands the result down: "tree" (every inner node relays it to its children,
# each unit ACKed, routed around dead links) or "fanout" (the root publishes each chunk once on
# its fan-out topic, which every member reads; a member that misses one pulls it from its
# parent). The reduce uses the per-link topics either way.
Broadcast = Literal["tree", "fanout"]
BROADCASTS: tuple[str, ...] = ("tree", "fanout")
# The default since issue 13's measurement (bench compare, same sitting, docs/PROFILE.md): the
# slowest agent's allreduce at 7 agents 44.8 ms against 53.0 ms relayed, float16 36.5 against
# 48.5 ms. Relayed, the result waits at every inner node for a hop per tree level, each a
# message through the broker and a wake-up on cores the agents share.
DEFAULT_BROADCAST: Broadcast = "fanout"


# A root's Will: the members wait this long for it to come back (its connection dropped:
# paho reconnects in 10-230 ms here) before they end the round without it. Ended at once,
# every flap of the root cost a skipped round, drifted members and their state transfers:
# 0.8-2.5 s rounds. A crashed root costs no more: the view without it comes a Will settle
# (1 s, longer than this) after the Will anyway.
ROOT_WILL_GRACE = 0.4
# The root itself goes on with its round only when it was away this much less than the
# grace: the members' clock runs from its Will to its birth status, which differ from its
# own disconnect and reconnect by the broker's reaction, and must not run out first.
ROOT_RETURN_MARGIN = 0.1
# Slow links (issue 19). A node whose transport reports a large frame arriving piece by piece
# or its own sends still queued (``RoundMachine.arriving``: its downlink or uplink is slow,
# and whatever else crosses it waits behind that frame) holds every silence verdict, resend
# and pull for DOWNLINK_BUSY_HOLD s after the report, and tells the other members so at most
# every PROGRESS_EVERY s (a PROBE with the PROGRESS flag): their units towards it are queued,
# not lost, and the round is still under way. The hard deadline of a round is put off while
# links show such progress, by DOWNLINK_BUSY_HOLD at a time, up to DEADLINE_STRETCH x
# round_deadline: a round on a 2 MB/s link needs more than the default 5 s.
DOWNLINK_BUSY_HOLD = 1.0
PROGRESS_EVERY = 0.1
# A report of silence stands DOWNLINK_BUSY_HOLD longer if such a backlog shows at the report:
# this long before it at most (the transport and PROGRESS repeat every 0.05-0.1 s while a frame
# still arrives), or after it.
BUSY_AT_REPORT = 2 * PROGRESS_EVERY
# A node with children waits for their data before it sends its parent anything, for as long
# as its subtree's depth of timeouts when one of them is slow or cut: its parent could tell it
# from a node cut off only after that whole wait. So until its round has a result it tells its
# parent every WAITING_EVERY s that it is in the round (a PROBE with the WAITING flag), and
# its parent finds it silent WAITING_EVERY and two timeouts after its last word.
WAITING_EVERY = 0.1
DEADLINE_STRETCH = 4.0
# A child's silence verdict waits for our own links only this long after their last report: a
# frame of the child queued behind the one we read comes as soon as that one is read (and
# reports itself if large). A whole DOWNLINK_BUSY_HOLD kept every verdict of the root waiting
# 1 s past its children's data on a busy host (the round of a cut 1.8-1.9 s at 15 agents).
OWN_LINK_HOLD = 2 * PROGRESS_EVERY

@dataclass(frozen=True)
class AllreduceConfig:
    algorithm: Algorithm = Algorithm.FT_TREE  # a name given is taken as its Algorithm
    chunk_size: int = DEFAULT_CHUNK_VALUES
    wire_dtype: DType = DType.F32  # every frame's format; with wire_auto, the widest one
    # ft-tree: each frame's format from its link's measured rate (agent/protocol/wire_choice.py),
    # so that this round's values take at most wire_budget seconds on the link.
    wire_auto: bool = False
    wire_budget: float = AUTO_WIRE_BUDGET
    timeout_mode: TimeoutMode = "adaptive"
    fixed_timeout: float = 0.5
    min_timeout: float = 0.02
    max_timeout: float = 2.0
    initial_timeout: float = 0.5
    link_rate_floor: float = 2e6  # bytes/s: a unit's timeout covers its drain at no faster a rate
    round_deadline: float = 10.0  # seconds after a node's start of the round; hard
    nack: bool = True
    job: int = 0  # wire.job_hash(job name); frames of other jobs are dropped
    reduce_fraction: float = 0.5  # the root stops waiting for contributions at this fraction
    pull_timeouts: float = 3.0  # RTOs without broadcast after my reduce is done -> pull
    remember_dead_links: bool = True  # ft-tree: a dead link stays dead in later rounds until probed
    broadcast: Broadcast = DEFAULT_BROADCAST  # ft-tree: see Broadcast
    # ft-tree: a unit's norm is held to this many running medians of our own gradient's
    # (agent/protocol/influence.py); 0: no bound. The agent's configuration sets it
    # (influence_bound, default DEFAULT_INFLUENCE_FACTOR); off here, the protocol's own tests
    # and the virtual fleet average their synthetic vectors exactly.
    influence_factor: float = 0.0
    # ft-tree, with an influence bound: a unit goes to the grandparent too, as an audit copy,
    # and an inner node's own part of its unit is bounded as a leaf's (agent/protocol/audit.py).
    audit_units: bool = False
    # ft-tree: a member slower than the rest (a straggler) is waited for at most this many
    # seconds after a node's own contribution was ready (the root's wait; a node below waits
    # its subtree's share of it, so the levels under the root cut theirs first), then left
    # out of the round like a silent member; 0: the waits as the deadline and the links say.
    straggler_deadline: float = 0.0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        object.__setattr__(self, "algorithm", Algorithm(self.algorithm))  # a name given: its Algorithm
        if self.broadcast not in BROADCASTS:
            raise ValueError(f"broadcast must be one of {BROADCASTS}, got {self.broadcast!r}")
        if self.timeout_mode not in ("adaptive", "fixed"):
            raise ValueError(f"timeout_mode must be adaptive or fixed, got {self.timeout_mode!r}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.wire_dtype == DType.U32:
            raise ValueError("wire_dtype must be F32, F16 or I8 (U32 is for indices)")
        if not 0 < self.min_timeout <= self.max_timeout:
            raise ValueError("need 0 < min_timeout <= max_timeout")
        if self.round_deadline <= 0 or self.fixed_timeout <= 0 or self.initial_timeout <= 0:
            raise ValueError("round_deadline, fixed_timeout and initial_timeout must be > 0")
        if self.wire_auto and self.algorithm is not Algorithm.FT_TREE:
            raise ValueError(f"wire_auto is for ft-tree, not {self.algorithm.value!r}")
        if self.wire_budget <= 0:
            raise ValueError("wire_budget must be > 0")
        if self.link_rate_floor <= 0:
            raise ValueError("link_rate_floor must be > 0")
        if not 0 < self.reduce_fraction < 1:
            raise ValueError("reduce_fraction must be in (0, 1)")
        if not self.influence_factor >= 0:
            raise ValueError("influence_factor must be >= 0")
        if not 0 <= self.straggler_deadline < float("inf"):
            raise ValueError("straggler_deadline must be a finite number of seconds >= 0")

    def new_links(self) -> LinkEstimators:
        """Estimators matching this config (the runtime keeps them across rounds)."""
        return LinkEstimators(
            min_timeout=self.min_timeout, max_timeout=self.max_timeout,
            initial_timeout=self.initial_timeout, rate_floor=self.link_rate_floor,
            fixed=self.fixed_timeout if self.timeout_mode == "fixed" else None,
        )


@dataclass(frozen=True)
class Send:
    dst: int
    frame: Frame


@dataclass(frozen=True)
class Fanout:
    """Publish ``frame`` once on this node's fan-out topic, which every member reads (the
    root's result, ``broadcast: fanout``)."""

    frame: Frame


@dataclass(frozen=True)
class Note:
    kind: NoteKind
    peer: int | None
    detail: str = ""


Action = Send | Fanout | Note


@dataclass
class RoundStats:
    reroutes: int = 0
    timeouts: int = 0
    nacks: int = 0
    pulls: int = 0
    relays: int = 0
    frames_sent: int = 0
    bytes_sent: int = 0
    frames_received: int = 0
    bytes_received: int = 0
    dropped: int = 0  # frames of this round that made no sense here (wrong size, not ours)
    overlaps: int = 0  # contributions refused because they overlapped counted ones
    retransmits: int = 0  # units resent on the same link (lost frame or lost ACK)
    implausible: int = 0  # units refused: values far beyond any honest gradient (see ft_tree)
    # Frames refused by what the round knows (a unit's contributors outside its origin's
    # subtree, a result off our routes up, pulls over budget), by RejectReason: the core
    # moves them into its telemetry's ``rejected`` as they come (``take_refused``).
    refused: Counter[str] = field(default_factory=Counter)
    # Frames of values sent (DATA and RELAY, the fan-out too) by wire format name ("float32",
    # "float16", "int8"): which formats wire_dtype "auto" used (audit copies, always int8, apart).
    wire_frames: dict[str, int] = field(default_factory=dict)


def take_refused(stats: RoundStats) -> Counter[str]:
    """What a round refused since the last call (the core counts each once, as it comes)."""
    refused, stats.refused = stats.refused, Counter()
    return refused


@dataclass(frozen=True)
class RoundResult:
    round: int
    values: np.ndarray  # float32, flat: what to apply
    contributors: tuple[frozenset[int], ...]  # per chunk
    missing_chunks: tuple[int, ...]  # chunks that fell back to the local value
    degraded: bool
    root_model_hash: int | None
    stats: RoundStats
    link_states: dict[int, str]
    finished_at: float = 0.0


@dataclass(frozen=True)
class RoundContext:
    """What every round machine starts from: the round's tree and this node's gradient."""

    config: AllreduceConfig
    tree: Tree
    node: int
    round: int
    gradient: np.ndarray  # float32, flat
    model_hash: int  # of the model the gradient was computed on
    links: LinkEstimators  # kept across rounds by the core
    now: float
    # Peers may start this round later than usual, each by its own amount: the fleet
    # evaluated the test set after the last round, or the last round here was degraded or ran
    # on another view (a root that went down, leaves asking for its result). A leaf's usual
    # first-frame time says nothing then.
    irregular_start: bool = False
    # Our own link's rate in bytes/s, from large messages' arrival on our downlink
    # (chunking.DownlinkRate; None: not measured): wire_auto narrows by it (wire_choice).
    own_link_rate: float | None = None
    # The bound on each unit's norm where it is first merged (None: no bound).
    influence: InfluenceBound | None = None
    # ft-tree, with a bound: which children lied in earlier rounds (kept by the core; None: a
    # record of this round only).
    plausibility: PlausibilityBook | None = None
    # ps-async: what the parameter server owes each worker across rounds (kept by the core;
    # None: a ledger of this round only).
    ledger: ServerLedger | None = None


class RoundMachine(Protocol):
    result: RoundResult | None
    tree: Tree

    @property
    def stats(self) -> RoundStats: ...

    def start(self, now: float) -> list[Action]: ...

    def on_frame(self, frame: Frame, now: float) -> list[Action]: ...

    def on_timer(self, now: float) -> list[Action]: ...

    def next_timer(self) -> float | None: ...

    def peer_down(self, peer: int, now: float) -> list[Action]: ...

    def excuse(self, peer: int, now: float) -> list[Action]:
        """A member reported ``peer`` silent this round: stop waiting for its contribution
        (one report is enough for that; routing around it needs ``peer_down``)."""
        ...

    def reconnected(self, now: float, away: float = float("inf")) -> list[Action]:
        """Our broker connection dropped and came back within this round, ``away`` seconds
        later: frames in flight either way may be lost, and the peers got our Will, so they
        may have ended the round without us. Recover what can be recovered at once instead
        of by timeouts."""
        ...

    def peer_away(self, peer: int, now: float) -> list[Action]:
        """``peer``'s Will came, and we give it a moment to come back (``ROOT_WILL_GRACE``):
        no verdict on it or its links meanwhile (its silence is explained), nothing resent."""
        ...

    def peer_back(self, peer: int, now: float) -> list[Action]:
        """``peer``'s Will came, and it is back (its connection dropped, the same life) before
        we routed around it: what we sent it meanwhile is lost, send it again now."""
        ...

    def peer_spoke(self, peer: int, now: float) -> list[Action]:
        """``peer`` was reported silent and spoke since (it refuted the report): it lives,
        only its links are slow or cut. What waited for the fleet's verdict goes out now."""
        ...

    def went_on(self, now: float) -> list[Action]:
        """The fleet may have run this round around us (our connection dropped briefly and
        the peers routed around us on our Will, or a member's data of the next round reached
        us): ask for the result now, once, from whoever would send it anyway (no second copy
        when it does), and ask for what our children sent while we were away."""
        ...

    def arriving(self, sender: int | None, now: float) -> list[Action]:
        """Our transport says a large frame from ``sender`` is still arriving, piece by piece:
        our downlink is slow, ``sender`` lives, and what others sent us queues behind it. Or
        (``sender`` None) that what we published is still waiting to leave: our uplink is
        slow, and what we sent is queued, not lost."""
        ...


class Outbox:
    """What one call of a round machine queues (frames out, notes), handed back by ``flush``;
    every round machine has one (its ``out``), counting the frames it sends in its ``stats``."""

    def __init__(self, stats: RoundStats) -> None:
        self.stats = stats
        self.actions: list[Action] = []

    def send(self, dst: int, frame: Frame) -> None:
        self._count(frame)
        self.actions.append(Send(dst, frame))

    def fanout(self, frame: Frame) -> None:
        self._count(frame)
        self.actions.append(Fanout(frame))

    def _count(self, frame: Frame) -> None:
        self.stats.frames_sent += 1
        self.stats.bytes_sent += frame_size(frame)
        if (frame.kind is Kind.DATA or frame.kind is Kind.RELAY) and not frame.is_audit_copy:
            name = WIRE_NAMES.get(frame.dtype)
            if name is not None:
                self.stats.wire_frames[name] = self.stats.wire_frames.get(name, 0) + 1

    def note(self, kind: NoteKind, peer: int | None, detail: str = "") -> None:
        self.actions.append(Note(kind, peer, detail))

    def flush(self) -> list[Action]:
        out, self.actions = self.actions, []
        return out


def frame_size(frame: Frame) -> int:
    """Bytes of ``encode(frame)`` without encoding it (header, bitmap, payload, CRC)."""
    top = max(frame.contributors) if frame.contributors else -1
    return HEADER_SIZE + (top // 8 + 1 if top >= 0 else 0) + len(frame.payload) + 4


def chunk_bounds(length: int, chunk_size: int) -> list[tuple[int, int]]:
    """[start, stop) of every chunk; a zero-length vector still has one (empty) chunk."""
    if length == 0:
        return [(0, 0)]
    return [(s, min(s + chunk_size, length)) for s in range(0, length, chunk_size)]


def merge_means(parts: Sequence[tuple[frozenset[int], np.ndarray]]) -> tuple[frozenset[int], np.ndarray]:
    """Weighted mean of means over DISJOINT contributor sets (float64 accumulate, float32 out)."""
    if len(parts) == 1:
        ids, values = parts[0]
        return ids, np.asarray(values, dtype=np.float32)
    total: set[int] = set()
    acc = np.zeros(len(parts[0][1]), dtype=np.float64)
    # The same operations in the same order as acc += float64(values) * n, acc / N (bit for
    # bit), without a new 8-byte temporary per step: every merge of a round passes here.
    scaled = np.empty_like(acc)
    for ids, values in parts:
        if total & ids:
            raise ValueError("merge_means needs disjoint contributor sets")
        total |= ids
        scaled[...] = values
        scaled *= len(ids)
        acc += scaled
    acc /= len(total)
    return frozenset(total), acc.astype(np.float32)


@dataclass
class LinkBook:
    """What one node saw of its links this round, for telemetry and the dashboard."""

    states: dict[int, str] = field(default_factory=dict)
    _rank = {"ok": 0, "suspected": 1, "rerouted": 2, "failed": 3}  # noqa: RUF012

    def mark(self, peer: int, state: str) -> None:
        if self._rank[state] > self._rank[self.states.get(peer, "ok")]:
            self.states[peer] = state

    def healed(self, peer: int) -> None:
        self.states[peer] = "ok"

    def known(self, peers: Sequence[int]) -> None:
        for p in peers:
            self.states.setdefault(p, "ok")
