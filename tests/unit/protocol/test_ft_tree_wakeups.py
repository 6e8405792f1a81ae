"""A round's decisions do not depend on when else it is woken.

The driver calls ``on_timer`` when ``next_timer()`` is due, and also at other instants (another
timer of the same core, a tick). Every check ``on_timer`` runs must therefore be scheduled by
``next_timer`` exactly: a check that ran only when an unrelated timer happened to fire made
a silent child's report go out, or not, depending on incidental wake-ups (a child that sent
nothing by its silence time, once the wait for contributions had fired, was reported only when
an ACK batch, a pending unit or the fan-out watch woke the machine).

Each scenario runs one round on every node of a small fleet twice, on an in-memory network
with a fake clock (seeded loss, a frozen node): once woken only at ``next_timer()``, once also
at extra random instants. The extra wake-ups must emit nothing, and every node's actions
(frames, notes, the silence reports) and result must be the same in both runs."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from agent.protocol.allreduce import (
    DOWNLINK_BUSY_HOLD,
    Action,
    AllreduceConfig,
    Fanout,
    Note,
    RoundContext,
    Send,
)
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

TREE = Tree(tuple(range(7)), 2)  # 0 root; inner 1 (leaves 3, 4) and 2 (leaves 5, 6)
LENGTH = 37
# Timeouts long against the round: a child's silence time (two timeouts per level below it)
# comes after the wait for contributions fired (0.5 s at the root, 0.33 s at an inner node).
FIXED = AllreduceConfig(chunk_size=8, timeout_mode="fixed", fixed_timeout=0.2, round_deadline=1.0)
ADAPTIVE = AllreduceConfig(chunk_size=8, min_timeout=0.02, initial_timeout=0.2, round_deadline=1.0)


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    node: int = field(compare=False)
    kind: str = field(compare=False)  # frame | wake | poke | call<i>
    frame: Frame | None = field(compare=False, default=None)


@dataclass
class Run:
    """One round on every node; ``trace[node]``: (time, action) in the order emitted."""

    config: AllreduceConfig
    frozen: int | None
    freeze_at: float
    loss: float
    seed: int
    calls: tuple[tuple[float, int, str, tuple[object, ...]], ...] = ()  # (at, node, method, args)
    pokes: list[tuple[float, int]] = field(default_factory=list)  # extra on_timer calls
    trace: dict[int, list[tuple[float, object]]] = field(default_factory=dict)
    poked: int = 0  # extra calls made at an instant with no timer due

    def run(self) -> dict[int, FtTreeRound]:
        self.queue: list[_Event] = []
        self.seq = 0
        self.booked: dict[int, float | None] = {}
        self.sent: dict[tuple[int, int], int] = {}
        self.machines = {
            n: FtTreeRound(RoundContext(self.config, TREE, n, 0, np.full(LENGTH, float(n), np.float32), 0,
                                        self.config.new_links(), 0.0))
            for n in TREE.members
        }
        for n, m in self.machines.items():
            self.trace[n] = []
            if self._alive(n, 0.0):
                self._out(n, 0.0, m.start(0.0))
        for at, n in self.pokes:
            self._push(at, n, "poke")
        for i, (at, n, _, _) in enumerate(self.calls):
            self._push(at, n, f"call{i}")
        while self.queue:
            ev = heapq.heappop(self.queue)
            if not self._alive(ev.node, ev.at):
                continue
            m = self.machines[ev.node]
            if ev.kind == "frame":
                assert ev.frame is not None
                self._out(ev.node, ev.at, m.on_frame(ev.frame, ev.at))
            elif ev.kind == "wake":
                if self.booked.get(ev.node) != ev.at:
                    continue  # superseded
                self.booked[ev.node] = None
                self._out(ev.node, ev.at, m.on_timer(ev.at))
            elif ev.kind.startswith("call"):  # the core's word: a Will, a busy downlink
                _, _, method, args = self.calls[int(ev.kind[4:])]
                self._out(ev.node, ev.at, getattr(m, method)(*args, ev.at))
            else:
                wake = m.next_timer()
                if wake is not None and ev.at < wake:  # nothing due: must change nothing
                    self.poked += 1
                    self._out(ev.node, ev.at, m.on_timer(ev.at))
        return self.machines

    def _alive(self, node: int, at: float) -> bool:
        return node != self.frozen or at < self.freeze_at

    def _push(self, at: float, node: int, kind: str, frame: Frame | None = None) -> None:
        self.seq += 1
        heapq.heappush(self.queue, _Event(at, self.seq, node, kind, frame))

    def _latency(self, src: int, dst: int) -> float:
        return 0.001 + 1e-5 * (7 * src + dst)  # distinct per link: no ties between links

    def _deliver(self, src: int, dst: int, now: float, frame: Frame) -> None:
        k = self.sent[src, dst] = self.sent.get((src, dst), 0) + 1
        # Per link and frame number: the same frames are lost however the events interleave.
        if random.Random(f"{self.seed}/{src}/{dst}/{k}").random() >= self.loss:
            self._push(now + self._latency(src, dst), dst, "frame", frame)

    def _out(self, node: int, now: float, actions: list[Action]) -> None:
        for a in actions:
            self.trace[node].append((now, a))
            if isinstance(a, Send):
                self._deliver(node, a.dst, now, a.frame)
            elif isinstance(a, Fanout):
                for dst in TREE.members:
                    if dst != node:
                        self._deliver(node, dst, now, a.frame)
        wake = self.machines[node].next_timer()
        if wake is not None and wake != self.booked.get(node):
            self.booked[node] = wake
            self._push(wake, node, "wake")


Calls = tuple[tuple[float, int, str, tuple[object, ...]], ...]
# The root's Will at 0.3 s (it froze at 0.03 s): every member skips what it lacks.
ROOT_WILL: Calls = tuple((0.3, n, "peer_down", (0,)) for n in range(1, 7))
# Node 1's downlink reports a large frame from its child 3 still arriving, for 0.3 s.
BUSY: Calls = tuple((0.02 * i, 1, "arriving", (3,)) for i in range(1, 16))


def _scenarios() -> list[tuple[str, AllreduceConfig, int | None, float, Calls, float, int]]:
    out = []
    for cname, base in (("fixed", FIXED), ("adaptive", ADAPTIVE)):
        for broadcast in ("tree", "fanout"):
            config = replace(base, broadcast=broadcast)
            faults: list[tuple[str, int | None, float, Calls]] = [
                (f"frozen{frozen}@{at}", frozen, at, ())
                for frozen, at in ((None, 0.0), (4, 0.0), (1, 0.0), (2, 0.02), (5, 0.4))]
            faults.append(("root-will", 0, 0.03, ROOT_WILL))
            if base.timeout_mode != "fixed":
                faults.append(("busy-frozen4", 4, 0.0, BUSY))
            for fname, frozen, at, calls in faults:
                for loss in (0.0, 0.1):
                    for seed in (0, 1) if loss else (0,):
                        name = f"{cname}-{broadcast}-{fname}-loss{loss}-seed{seed}"
                        out.append((name, config, frozen, at, calls, loss, seed))
    return out


def _summary(machines: dict[int, FtTreeRound]) -> dict[int, object]:
    return {n: None if m.result is None else
            (m.result.values.tobytes(), m.result.contributors, m.result.degraded, m.result.finished_at)
            for n, m in machines.items()}


@pytest.mark.parametrize(("config", "frozen", "freeze_at", "calls", "loss", "seed"),
                         [s[1:] for s in _scenarios()], ids=[s[0] for s in _scenarios()])
def test_extra_wakeups_change_nothing(config: AllreduceConfig, frozen: int | None, freeze_at: float,
                                      calls: Calls, loss: float, seed: int) -> None:
    plain = Run(config, frozen, freeze_at, loss, seed, calls)
    plain_result = _summary(plain.run())
    rng = random.Random(seed * 1000 + 17)
    pokes = sorted((rng.uniform(0.0, config.round_deadline * 1.05), n) for n in TREE.members for _ in range(60))
    poked = Run(config, frozen, freeze_at, loss, seed, calls, pokes=pokes)
    poked_result = _summary(poked.run())
    assert poked.poked > 100  # the extra wake-ups did happen
    for node in TREE.members:
        assert poked.trace[node] == plain.trace[node], f"node {node}: extra wake-ups changed its actions"
    assert poked_result == plain_result


def test_a_childs_silence_report_goes_out_at_its_time_after_the_wait_fired() -> None:
    """The root stops waiting at 0.5 s; its child 1 (frozen from the start) has until about
    0.8 s (two timeouts per level) to send its first frame: reported then, not when some other
    timer happens to wake the root."""
    run = Run(FIXED, 1, 0.0, 0.0, 0)
    machines = run.run()
    root = machines[0]
    assert root.wait.at < root.scope.start_time + root.watch.silence_span(1)
    reports = [(t, a) for t, a in run.trace[0] if isinstance(a, Note) and a.kind == "silent" and a.peer == 1]
    assert reports, "child 1 never reported"
    at, note = reports[0]
    assert note.detail == "nothing from it for a whole wait"
    assert at == pytest.approx(root.watch.silence_span(1), abs=1e-9)


def test_a_relay_verdict_put_off_while_our_links_drain_is_woken_when_they_stop() -> None:
    """Leaf 4 relays its sibling 3's unit to their parent 1, which never answers, while our
    downlink reports a large frame arriving: the verdict waits until the links stop draining.
    next_timer said "now" all that time (the relay's time had passed, the check held it
    back): the driver woke the round over and over at one instant, with nothing to do."""
    config = replace(ADAPTIVE, round_deadline=5.0)
    leaf = FtTreeRound(RoundContext(config, TREE, 4, 0, np.zeros(LENGTH, np.float32), 0, config.new_links(), 0.0))
    leaf.start(0.0)
    unit = Frame(Kind.RELAY, config.job, 0, 3, 0, 5, origin=3, target=1,
                 contributors=frozenset({3})).with_values(np.ones(8, np.float32), config.wire_dtype)
    leaf.on_frame(unit, 0.01)
    leaf.arriving(None, 0.02)  # draining until 0.02 + DOWNLINK_BUSY_HOLD
    wakes: list[float] = []
    reported = None
    while reported is None:
        wake = leaf.next_timer()
        assert wake is not None and wake < config.round_deadline, wakes
        assert not wakes or wake > wakes[-1], f"woken again at {wake} with nothing to do: {wakes}"
        wakes.append(wake)
        for a in leaf.on_timer(wake):
            if isinstance(a, Note) and a.kind == "silent" and a.peer == 1 and a.detail == "relayed to it, no answer":
                reported = wake
    assert reported == pytest.approx(0.02 + DOWNLINK_BUSY_HOLD)


@pytest.mark.parametrize("counted", [True, False])
def test_a_child_the_result_counts_is_not_reported_silent(counted: bool) -> None:
    """Inner node 1 hears nothing from its leaf 3 (3's unit went around it, to the root over a
    backup link), goes on without it at its wait, and then has the root's result: a result
    that counts 3 says 3 is alive, so no report; one that does not count 3 leaves the report
    at 3's silence time."""
    node = FtTreeRound(RoundContext(FIXED, TREE, 1, 0, np.zeros(LENGTH, np.float32), 0, FIXED.new_links(), 0.0))
    node.start(0.0)
    chunks = len(node.chunks)
    for j in range(chunks):
        unit = Frame(Kind.DATA, FIXED.job, 0, 4, j, chunks, contributors=frozenset({4}))
        node.on_frame(unit.with_values(np.ones(min(8, LENGTH - 8 * j), np.float32), FIXED.wire_dtype), 0.01)
    silence = node.watch.silence_at[3]
    assert node.wait.at < silence  # the wait fires first: the report comes after it
    now, notes = 0.0, []
    while (wake := node.next_timer()) is not None and wake < node.wait.at + 0.01:
        now = wake
        notes += [a for a in node.on_timer(now) if isinstance(a, Note)]
    assert not node.state.waiting and node.result is None
    everyone = frozenset(range(7)) if counted else frozenset(range(7)) - {3}
    for j in range(chunks):
        final = Frame(Kind.DATA, FIXED.job, 0, 0, j, chunks, Flag.BROADCAST | Flag.FINAL, contributors=everyone)
        node.on_frame(final.with_values(np.ones(min(8, LENGTH - 8 * j), np.float32), FIXED.wire_dtype),
                      now + 0.001)
    assert node.result is not None
    while (wake := node.next_timer()) is not None and wake < silence + 0.5:
        notes += [a for a in node.on_timer(wake) if isinstance(a, Note)]
    # (The broadcast relayed to 3 goes unACKed too: that link's own verdict is another report.)
    reported = [a for a in notes if a.kind == "silent" and a.peer == 3 and a.detail == "nothing from it for a whole wait"]
    assert bool(reported) is not counted, notes
