"""The agent core (agent/core/): the dispatch of frames to round machines around round
boundaries, the end of a run, the phases. The same core runs in the real agent
(agent/runtime.py) and in the in-memory fleet (simulate/virtual_fleet.py); these tests drive it
through the fleet harness and directly."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import pytest

from agent.core import (
    AgentCore,
    ApplyUpdate,
    Channel,
    ComputeGradient,
    CoreConfig,
    Displaced,
    Phase,
    Publish,
    ReportRound,
    RoundReport,
    SendState,
    telemetry_for,
)
from agent.core.events import (
    Arriving,
    Disconnected,
    FrameArrived,
    GradientReady,
    MessageArrived,
    Reconnected,
    Sending,
    StatusSeen,
    SuspectSeen,
    Tick,
    ViewSeen,
)
from agent.core.rounds import ABSENCE_SETTLE_S
from agent.protocol.allreduce import AllreduceConfig, Broadcast, RoundResult, RoundStats
from agent.protocol.answer_budget import padded
from agent.protocol.chunking import SLOW_LINK_CHUNK_VALUES
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.messages import Status, Suspect, Telemetry, View
from agent.protocol.state_transfer import state_frame_bytes, state_hash
from agent.protocol.wire import NO_NODE, Flag, Frame, Kind, encode
from simulate.virtual_fleet import FaultSpec, FleetConfig, SimAgent, VirtualFleet

CONFIG = AllreduceConfig(chunk_size=8, timeout_mode="fixed", fixed_timeout=0.05, round_deadline=1.0)


def published(actions: list[Any], kind: type[Any]) -> list[Any]:
    """The messages of ``kind`` (Status, View, Suspect) among the core's actions."""
    return [a.message for a in actions if isinstance(a, Publish) and isinstance(a.message, kind)]


def is_send(action: Any) -> bool:
    """A frame for one peer (``action.dst``, ``action.frame``)."""
    return isinstance(action, Publish) and action.channel is Channel.LINK


def fleet_with_gaps(rounds: int) -> VirtualFleet:
    # compute_time: a gap between the end of round r and the start of r + 1, as a real agent's
    # gradient computation makes; the last ACKs of round r's broadcast arrive inside it.
    return VirtualFleet(FleetConfig(nodes=7, rounds=rounds, length=37, allreduce=CONFIG,
                                    compute_time=0.02, latency=0.001))


def test_late_frames_of_a_finished_round_reach_its_machine_between_rounds() -> None:
    fleet = fleet_with_gaps(6)
    records = fleet.run()
    assert [r.round for r in records] == list(range(6)) and not any(r.degraded for r in records)
    results = [res for rec in records for res in rec.results.values()]
    # An ACK of round r dropped between rounds leaves its unit unacknowledged: it is resent
    # after a timeout, and (remembered dead links) the healthy link is declared dead.
    assert sum(r.stats.retransmits for r in results) == 0
    assert sum(r.stats.timeouts for r in results) == 0
    notes = [n.kind for rec in records for ns in rec.notes.values() for n in ns]
    assert "link_dead" not in notes and "timeout" not in notes
    for agent in fleet.agents.values():
        assert agent.core.parts.counters.rejected["stale_round"] == 0, agent.node


def test_frames_of_the_last_round_are_answered_during_the_linger() -> None:
    fleet = fleet_with_gaps(3)
    fleet.run()
    fleet.bus.run_until(fleet.clock.now() + 0.5)  # every frame in flight arrives
    for agent in fleet.agents.values():
        core = agent.core
        assert core.phase == Phase.LINGERING and core.round == 3
        last = core.parts.rounds.machines[2]
        # Every ACK of the last broadcast reached it: nothing was resent, nothing timed out.
        stats = last.stats  # type: ignore[attr-defined]
        assert stats.retransmits == 0 and stats.timeouts == 0, (agent.node, stats)
        assert core.parts.counters.rejected["stale_round"] == 0
        received = stats.frames_received
        pull = Frame(Kind.PULL, CONFIG.job, 2, (agent.node + 1) % 7, 0, 1).with_indices([0])
        core.handle(FrameArrived(pull), fleet.clock.now())
        assert stats.frames_received == received + 1
    fleet.bus.run_until(fleet.clock.now() + 2 * CONFIG.round_deadline)
    assert all(a.core.phase == Phase.DONE for a in fleet.agents.values())


def test_a_state_of_a_round_after_the_last_one_is_installed_not_run() -> None:
    """Catching up by state transfer to round R (= rounds) ends the run: no round R."""
    core = AgentCore(CoreConfig(node=1, rounds=3, allreduce=CONFIG, state_size=4, linger=1.0), 5)
    core.handle(ViewSeen(View(1, [0, 1], 2, 0, 0)), 0.0)
    actions = core.handle(StatusSeen(Status(1, "online", incarnation=5)), 0.0)
    assert [type(a) for a in actions] == [ComputeGradient] and core.phase == Phase.COMPUTING
    core.parts.fetch.received = (3, np.zeros(4, np.float32))  # the fleet's final state arrived
    core.handle(GradientReady(0, 1.0, np.ones(37, np.float32), 0), 0.01)
    assert core.phase == Phase.LINGERING and core.round == 3
    assert 3 not in core.parts.rounds.machines and core.next_deadline() is not None


def test_caught_up_by_a_state_transfer_we_say_so_at_the_fleets_round() -> None:
    """A report of our silence that we refuted while far behind stood: the membership ignores
    a status far behind the fleet. Caught up, our status at the fleet's round refutes it, and
    a member that suspected us takes us back."""
    core = AgentCore(CoreConfig(node=1, rounds=50, allreduce=CONFIG, state_size=4), 5)
    core.handle(ViewSeen(View(1, [0, 1], 2, 0, 0)), 0.0)
    core.handle(StatusSeen(Status(1, "online", incarnation=5)), 0.0)
    core.parts.fetch.received = (9, np.zeros(4, np.float32))  # the fleet's state, rounds ahead
    actions = core.handle(GradientReady(0, 1.0, np.ones(37, np.float32), 0), 0.01)
    assert core.round == 9
    ours = published(actions, Status)
    assert [(s.node, s.state, s.round) for s in ours] == [(1, "online", 9)]
    peer = AgentCore(CoreConfig(node=0, rounds=50, allreduce=CONFIG, state_size=4), 3)
    peer.handle(ViewSeen(View(1, [0, 1], 2, 0, 0)), 0.0)
    peer.parts.membership.round = 9
    peer.parts.membership.witnesses.evicted.add(1)  # the fleet's witnesses found us silent
    peer.handle(StatusSeen(Status(1, "online", round=2, incarnation=5)), 0.02)
    assert peer.parts.membership.is_down(1)  # far behind: no word at the fleet's round
    peer.handle(StatusSeen(ours[0]), 0.03)
    assert not peer.parts.membership.is_down(1)


def test_a_fleet_that_runs_without_us_makes_us_join() -> None:
    core = AgentCore(CoreConfig(node=4, allreduce=CONFIG, state_size=4), 9)
    core.handle(ViewSeen(View(3, [0, 1, 2], 2, 0, 40)), 0.0)  # a running fleet's retained view
    actions = core.handle(StatusSeen(Status(4, "online", incarnation=9)), 0.0)
    assert core.phase == Phase.JOINING
    assert [s.state for s in published(actions, Status)] == ["joining"]
    assert not any(isinstance(a, ReportRound | ComputeGradient) for a in actions)


def test_after_a_reconnect_the_coordinator_says_again_who_it_is_and_decides_nothing_for_a_while() -> None:
    core = AgentCore(CoreConfig(node=0, allreduce=CONFIG, state_size=4, reconnect_hold=3.0), 7)
    core.handle(ViewSeen(View(2, [0, 1, 2], 2, 0, 0)), 0.0)
    core.handle(StatusSeen(Status(0, "online", incarnation=7)), 0.0)
    for peer in (1, 2):
        core.handle(StatusSeen(Status(peer, "online")), 0.0)
    actions = core.handle(Reconnected(), 5.0)  # the broker restarted, nothing retained
    assert [s.state for s in published(actions, Status)] == ["online"]
    assert published(actions, View) == [View(2, [0, 1, 2], 2, 0, 0)]
    # A Will-less partial picture: node 2 offline (say, its status came back as its Will).
    assert not published(core.handle(StatusSeen(Status(2, "offline")), 6.0), View)
    later = core.handle(Tick(), 8.1)  # the hold is over: now the coordinator acts on what it knows
    assert [v.members for v in published(later, View)] == [[0, 1]]


def _hall_member_in_a_round(allreduce: AllreduceConfig = CONFIG) -> AgentCore:
    """Node 4 of the hall (3, 4, 5) in round 0 of a fleet with the barn (0, 1, 2)."""
    core = AgentCore(CoreConfig(node=4, rounds=50, allreduce=allreduce, state_size=4, site="hall"), 3)
    sites = ["barn"] * 3 + ["hall"] * 3
    core.handle(ViewSeen(View(1, list(range(6)), 2, 0, 0, sites=sites)), 0.0)
    for peer in range(6):
        core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == 4 else 0, site=sites[peer])), 0.0)
    core.handle(GradientReady(0, 1.0, np.ones(37, np.float32), 0), 0.01)
    assert core.phase == Phase.RUNNING
    return core


# The barn's coordinator went on without the hall: the hall's broker restarted (its bridge down),
# and it published none of the hall's Wills, so node 4 saw none of its site go.
WITHOUT_THE_HALL = View(2, [0, 1, 2], 2, 0, 3, sites=["barn"] * 3)


def test_back_from_its_broker_away_a_node_takes_the_fleets_view_without_its_site_and_rejoins_at_once() -> None:
    core = _hall_member_in_a_round()
    core.handle(Disconnected(), 0.1)
    core.handle(Reconnected(), 5.1)
    actions = core.handle(ViewSeen(WITHOUT_THE_HALL, 0), 5.2)
    assert core.phase == Phase.JOINING  # not the round's deadline first
    assert [s.state for s in published(actions, Status)] == ["joining"]


def test_back_from_its_broker_away_a_node_the_fleet_went_on_without_resends_nothing() -> None:
    """Its round's units would go to a fleet long past that round (16 MB up a site's uplink
    after a site broker's restart): they are held ABSENCE_SETTLE_S, and the view leaving the
    site out ends the round first."""
    core = _hall_member_in_a_round(replace(CONFIG, round_deadline=30.0))
    core.handle(Disconnected(), 0.1)
    sent = [a for a in core.handle(Reconnected(), 5.1) if is_send(a)]
    sent += [a for a in core.handle(ViewSeen(WITHOUT_THE_HALL, 0), 5.15) if is_send(a)]
    sent += [a for a in core.handle(Tick(), 5.1 + ABSENCE_SETTLE_S) if is_send(a)]
    assert sent == [] and core.phase == Phase.JOINING


def test_back_from_its_broker_away_a_node_still_in_the_round_resends_after_the_hold() -> None:
    """The whole broker restarted (everybody was away): nobody says we are out, and the round's
    units go again once the hold is over; after a flap they go at once."""
    core = _hall_member_in_a_round(replace(CONFIG, round_deadline=30.0))
    core.handle(Disconnected(), 0.1)
    assert not [a for a in core.handle(Reconnected(), 5.1) if is_send(a)]
    assert core.next_deadline() is not None and core.next_deadline() <= 5.1 + ABSENCE_SETTLE_S
    resent = [a for a in core.handle(Tick(), 5.1 + ABSENCE_SETTLE_S) if is_send(a)]
    assert 3 in {a.dst for a in resent}  # its units to its parent, the hall's site root
    flapping = _hall_member_in_a_round(replace(CONFIG, round_deadline=30.0))
    flapping.handle(Disconnected(), 0.1)
    assert [a for a in flapping.handle(Reconnected(), 0.3) if is_send(a)]


def _computes(actions: list[Any]) -> bool:
    return any(isinstance(a, ComputeGradient) for a in actions)


@pytest.mark.parametrize("away", [0.2, 2.0])
def test_back_from_a_long_absence_a_node_starts_no_round_until_the_settle_is_over(away: float) -> None:
    """Its stale round, started at once, sent a site's agents' units up the uplink ahead of
    their joining statuses. After a flap the round starts at once."""
    core = AgentCore(CoreConfig(node=1, rounds=50, allreduce=CONFIG, state_size=4), 3)
    for peer in range(3):
        core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == 1 else 0)), 0.0)
    core.handle(Disconnected(), 0.1)
    back = 0.1 + away
    actions = core.handle(Reconnected(), back) + core.handle(ViewSeen(View(1, [0, 1, 2], 2, 0, 0), 0), back)
    if away < 1.0:
        assert _computes(actions)
        return
    assert not _computes(actions) and core.phase == Phase.WAITING
    assert core.next_deadline() == pytest.approx(back + ABSENCE_SETTLE_S)
    assert not _computes(core.handle(Tick(), back + ABSENCE_SETTLE_S / 2))
    assert _computes(core.handle(Tick(), back + ABSENCE_SETTLE_S))


def test_a_view_without_our_site_is_held_while_our_broker_stayed_with_us() -> None:
    # A compromised or wrong coordinator cannot evict a site nobody saw go.
    core = _hall_member_in_a_round()
    actions = core.handle(ViewSeen(WITHOUT_THE_HALL, 0), 0.2)
    assert core.phase == Phase.RUNNING and not published(actions, Status)
    assert core.parts.counters.rejected["view_removal_unwitnessed"] == 1


def _running_core(node: int = 1, members: tuple[int, ...] = (0, 1, 2, 3),
                  downlink_rate: float | None = None) -> AgentCore:
    """``node`` in round 0; with ``downlink_rate``, eight large frames from node 0 arrived at
    that rate (bytes/s) before its gradient."""
    core = AgentCore(CoreConfig(node=node, rounds=50, allreduce=CONFIG, state_size=4), 3)
    core.handle(ViewSeen(View(1, list(members), 2, 0, 0)), 0.0)
    for peer in members:
        core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == node else 0)), 0.0)
    for _ in range(8 if downlink_rate else 0):
        core.handle(MessageArrived(core.parts.topics.link(0, node), _big_frame(0), BIG_FRAME_BYTES / downlink_rate), 0.005)
    core.handle(GradientReady(0, 1.0, np.ones(37, np.float32), 0), 0.01)
    return core


def test_a_model_pull_flood_gets_one_state_per_peer_and_round() -> None:
    core = _running_core()
    pull = Frame(Kind.MODEL_PULL, CONFIG.job, 0, 2, 0, 1)
    sent = [a for _ in range(100) for a in core.handle(FrameArrived(pull), 0.02) if type(a).__name__ == "SendState"]
    assert len(sent) == 1 and core.parts.counters.rejected["model_pull_repeat"] == 99


def _paid(pull: Frame) -> Frame:
    """``pull`` padded to pay for a whole state of 40 values (answer_budget.py)."""
    return padded(pull, sum(state_frame_bytes(40, 4, j) for j in range(10)))


def _striped_core() -> AgentCore:
    """Node 1 of four, a state of 10 chunks (two stripes of 5)."""
    core = AgentCore(CoreConfig(node=1, rounds=50, allreduce=CONFIG, state_size=40, state_chunk_values=4), 3)
    core.handle(ViewSeen(View(1, [0, 1, 2, 3], 2, 0, 0)), 0.0)
    for peer in (0, 1, 2, 3):
        core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == 1 else 0)), 0.0)
    core.handle(GradientReady(0, 1.0, np.ones(37, np.float32), 0), 0.01)
    return core


def test_a_puller_gets_at_most_one_state_per_round_and_each_chunk_once() -> None:
    core = _striped_core()
    stripe = _paid(Frame(Kind.MODEL_PULL, CONFIG.job, 0, 2, 0, 1).with_indices([0, 2, 4, 6, 8]))
    first = [a for a in core.handle(FrameArrived(stripe), 0.02) if isinstance(a, SendState)]
    assert len(first) == 1 and first[0].chunks == (0, 2, 4, 6, 8)
    frames = core.state_frames(first[0], np.arange(40, dtype=np.float32))
    assert [s.frame.chunk_index for s in frames] == [0, 2, 4, 6, 8]
    assert all(s.frame.model_hash == state_hash(np.arange(40, dtype=np.float32)) for s in frames)
    everything = _paid(Frame(Kind.MODEL_PULL, CONFIG.job, 0, 2, 0, 1))  # one stripe is its share
    assert not [a for a in core.handle(FrameArrived(everything), 0.03) if isinstance(a, SendState)]
    assert core.parts.counters.rejected["model_pull_budget"] == 1
    # Another member pulls this round too (a fault made several drift): the rest, then nothing.
    core.handle(FrameArrived(_paid(Frame(Kind.MODEL_PULL, CONFIG.job, 0, 3, 0, 1).with_indices([1]))), 0.032)
    rest = [a for a in core.handle(FrameArrived(everything), 0.035) if isinstance(a, SendState)]
    assert len(rest) == 1 and rest[0].chunks == (1, 3, 5, 7, 9)
    again = [a for a in core.handle(FrameArrived(everything), 0.04) if isinstance(a, SendState)]
    assert again == [] and core.parts.counters.rejected["model_pull_repeat"] == 1


def test_one_peer_claiming_the_fleet_is_ahead_does_not_make_us_fetch_its_state() -> None:
    core = _running_core()
    ahead = Frame(Kind.DATA, CONFIG.job, 7, 3, 0, 5, origin=3)
    assert not [a for a in core.handle(FrameArrived(ahead), 0.02) if is_send(a)]
    assert core.parts.fetch.transfer is None and core.phase == Phase.RUNNING
    # A second member shows the same: now it is the fleet, and the coordinator is asked first.
    core.handle(FrameArrived(Frame(Kind.DATA, CONFIG.job, 7, 2, 0, 5, origin=2)), 0.03)
    assert core.parts.fetch.transfer is not None and core.parts.fetch.transfer.peers[0] == 0


def test_a_state_with_nan_is_never_installed_and_the_next_peer_is_asked() -> None:
    core = _running_core()
    core.handle(FrameArrived(Frame(Kind.DATA, CONFIG.job, 7, 3, 0, 5, origin=3)), 0.02)
    core.handle(FrameArrived(Frame(Kind.DATA, CONFIG.job, 7, 2, 0, 5, origin=2)), 0.03)
    assert core.parts.fetch.transfer is not None
    asked = core.parts.fetch.transfer.peer
    nan = np.array([1.0, np.nan, 0.0, 0.0], np.float32)
    bad = Frame(Kind.MODEL, CONFIG.job, 8, asked, 0, 1, target=1, model_hash=state_hash(nan)).with_values(nan)
    out = core.handle(FrameArrived(bad), 0.05)
    assert core.parts.fetch.received is None and core.parts.counters.rejected["state_not_finite"] == 1
    assert [a.dst for a in out if is_send(a)] == [core.parts.fetch.transfer.peer] != [asked]


def test_a_newer_agent_with_our_id_makes_us_stop_without_a_fight() -> None:
    core = _running_core(node=1)
    core.handle(StatusSeen(Status(1, "online", incarnation=2)), 0.1)  # an older life's status: ignored
    assert core.phase != Phase.DONE
    out = core.handle(StatusSeen(Status(1, "online", incarnation=9, pid=4242)), 0.2)
    assert out == [Displaced(9, 4242)] and core.phase == Phase.DONE
    assert core.handle(StatusSeen(Status(1, "online", incarnation=10)), 0.3) == []  # said once


def test_a_self_report_routes_around_its_sender_and_only_its_sender_can_make_it() -> None:
    core = _running_core(node=1, members=(0, 1, 2, 3))  # node 3 is our child in round 0
    topics = core.parts.topics
    forged = Suspect(3, 0, 3).encode()  # "3 is absent", published on node 2's topic
    assert core.handle(MessageArrived(topics.suspect(2), forged), 0.02) == []
    assert core.parts.counters.rejected["suspect_forged"] == 1 and 3 not in core.parts.book.absent
    core.handle(MessageArrived(topics.suspect(3), forged), 0.02)
    assert core.parts.book.absent == {3: 0}
    assert 3 in core.parts.rounds.machines[0].scope.down  # nobody waits a timeout for it in round 0


def test_a_suspect_that_announced_its_absence_says_so_again_and_still_refutes() -> None:
    core = _running_core(node=1)
    core.parts.book.absent_through = 2  # we fell behind: no part in rounds up to 2
    actions = core.handle(SuspectSeen(Suspect(0, 1, 1)), 0.05)
    reports = published(actions, Suspect)
    assert reports == [Suspect(1, 2, 1, 3)]
    assert [s.state for s in published(actions, Status)] == ["online"]


def test_a_pull_for_a_round_we_no_longer_answer_tells_the_puller_where_we_are() -> None:
    core = _running_core(node=1)
    core.progress.round = 9  # as if we had gone on: round 0's machine is long gone, round 9 runs
    core.parts.rounds.machines = {9: core.parts.rounds.machines.pop(0)}
    pull = Frame(Kind.PULL, CONFIG.job, 0, 3, 0, 1)
    probes = [a for a in core.handle(FrameArrived(pull), 0.1) if is_send(a)]
    assert [(p.dst, p.frame.kind, p.frame.round) for p in probes] == [(3, Kind.PROBE, 9)]
    assert not [a for a in core.handle(FrameArrived(pull), 0.2) if is_send(a)]  # once per round


def test_a_joiner_asked_about_a_round_it_cannot_run_says_it_is_absent() -> None:
    core = AgentCore(CoreConfig(node=4, allreduce=CONFIG, state_size=4), 9)
    core.handle(ViewSeen(View(3, [0, 1, 2, 4], 2, 0, 40)), 0.0)  # lists us, but we have no state yet
    core.handle(StatusSeen(Status(4, "online", incarnation=9)), 0.0)
    assert core.phase == Phase.JOINING
    actions = core.handle(SuspectSeen(Suspect(1, 41, 4)), 0.5)
    assert published(actions, Suspect) == [Suspect(4, 41, 4, 9)]


def _taken_back_after_the_end() -> AgentCore:
    """Node 4 of a 20-round run, evicted near the end; the view taking it back starts at 21."""
    core = AgentCore(CoreConfig(node=4, rounds=20, allreduce=CONFIG, state_size=4), 9, resumed_round=17)
    core.handle(ViewSeen(View(11, [0, 1, 2, 3, 4], 2, 0, 21)), 0.0)
    for peer in (0, 1, 2, 3):
        core.handle(StatusSeen(Status(peer, "online")), 0.0)
    core.handle(StatusSeen(Status(4, "online", incarnation=9)), 0.0)
    return core


def test_taken_back_after_the_last_round_we_fetch_the_final_state_and_finish() -> None:
    core = _taken_back_after_the_end()
    assert core.phase == Phase.JOINING and core.round == 20
    assert core.parts.fetch.transfer is not None and core.parts.fetch.transfer.round == 20  # the fleet's final state
    core.parts.fetch.received = (20, np.zeros(4, np.float32))
    actions = core.handle(Tick(), 0.1)
    assert core.phase == Phase.LINGERING and core.round == 20
    assert not any(isinstance(a, ComputeGradient) for a in actions)  # no round 20 or 21


def test_taken_back_after_the_last_round_with_nobody_answering_we_still_finish() -> None:
    core = _taken_back_after_the_end()
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= CONFIG.round_deadline
    for t in np.arange(0.0, CONFIG.round_deadline + 0.1, 0.05):
        core.handle(Tick(), float(t))
    assert core.phase == Phase.DONE and core.done


def _served(core: AgentCore, pull: Frame, now: float) -> list[tuple[int, ...]]:
    return [a.chunks or () for a in core.handle(FrameArrived(pull), now) if isinstance(a, SendState)]


def test_a_member_in_step_with_us_gets_one_stripe_a_round_unless_others_pull_too() -> None:
    """A drifted member takes a stripe from each of two peers; one that asks us for the whole
    state every round (a flooder) took one every 4 rounds: that round was 2.5x the root's."""
    core = _striped_core()
    machine = core.parts.rounds.machines.pop(0)
    got: list[tuple[int, ...]] = []
    for rnd in range(1, 9):
        core.progress.round, core.parts.rounds.machines = rnd, {rnd: machine}  # as if the rounds went by
        for _ in range(3):
            got += _served(core, _paid(Frame(Kind.MODEL_PULL, CONFIG.job, rnd, 2, 0, 1)), 0.1 * rnd)
    assert got == [(0, 1, 2, 3, 4)] * 8, got
    assert core.parts.counters.rejected["model_pull_budget"] == 8 * 2
    # Several members drifted at once (a broker restart): no two peers may agree, and the
    # coordinator's word alone resyncs them, so each gets the whole state from it.
    core.progress.round, core.parts.rounds.machines = 9, {9: machine}
    first = {p: _served(core, _paid(Frame(Kind.MODEL_PULL, CONFIG.job, 9, p, 0, 1).with_indices([0, 2])), 1.0)
             for p in (2, 3)}
    assert first == {2: [(0, 2)], 3: [(0, 2)]}
    rest = [i for i in range(10) if i not in (0, 2)]
    assert _served(core, _paid(Frame(Kind.MODEL_PULL, CONFIG.job, 9, 2, 0, 1).with_indices(rest)), 1.1) == [tuple(rest)]


def test_a_member_that_said_it_fell_behind_is_served_at_once() -> None:
    core = _running_core(node=1)
    core.progress.round, core.parts.rounds.machines = 5, {5: core.parts.rounds.machines.pop(0)}
    core.handle(MessageArrived(core.parts.topics.suspect(2), Suspect(2, 6, 2).encode()), 0.5)  # it fell behind
    pull = _paid(Frame(Kind.MODEL_PULL, CONFIG.job, 5, 2, 0, 1))
    assert any(isinstance(a, SendState) for a in core.handle(FrameArrived(pull), 0.6))


def test_a_member_that_keeps_saying_it_is_behind_gets_one_stripe_a_round() -> None:
    """Behind or joining, a puller asks each peer for one stripe; a device that claims to be
    behind and asks us for everything, every round, took a whole state every round."""
    core = _striped_core()
    core.handle(MessageArrived(core.parts.topics.suspect(2), Suspect(2, 10**6, 2).encode()), 0.02)  # "behind, for good"
    core.handle(StatusSeen(Status(3, "joining", incarnation=4)), 0.02)  # 3 rejoins, as a joiner does
    machine = core.parts.rounds.machines.pop(0)
    got: dict[int, list[tuple[int, ...]]] = {2: [], 3: []}
    for rnd in range(1, 13):
        core.progress.round, core.parts.rounds.machines = rnd, {rnd: machine}
        everything = _paid(Frame(Kind.MODEL_PULL, CONFIG.job, rnd, 2, 0, 1))
        stripe = _paid(Frame(Kind.MODEL_PULL, CONFIG.job, rnd, 3, 0, 1).with_indices([1, 3, 5, 7, 9]))
        # The joiner pulls in the even rounds (two pullers at once: see the test above).
        for pull in [everything] * 5 + ([stripe] if rnd % 2 == 0 else []):
            for a in core.handle(FrameArrived(pull), 0.1 * rnd):
                if isinstance(a, SendState):
                    got[a.request.sender].append(a.chunks or ())
    assert got[2] == [(0, 1, 2, 3, 4)] * 12, got[2]  # half a state a round, never the whole
    assert got[3] == [(1, 3, 5, 7, 9)] * 6  # a joiner's stripe, every round it asks
    assert core.parts.counters.rejected["model_pull_budget"] == 12 * 4  # the other asks of 2
    # The run over (lingering), the final sync of a member taken back late takes it whole.
    core.progress.phase = Phase.LINGERING
    core.progress.round, core.parts.rounds.machines = 13, {13: machine}
    last = [a for a in core.handle(FrameArrived(_paid(Frame(Kind.MODEL_PULL, CONFIG.job, 13, 2, 0, 1))), 2.0)
            if isinstance(a, SendState)]
    assert [len(a.chunks or ()) for a in last] == [10]


def test_a_member_late_to_a_round_whose_root_died_does_not_wait_once_the_next_view_is_out() -> None:
    """The root died while we were still in round 29; the coordinator's view without it
    starts at 31, as the others were at 30 already. Our round 30 (still the dead root's
    tree) ends at once, as theirs did, instead of waiting the whole root wait for a view."""
    core = _running_core(node=6, members=(0, 1, 2, 3, 4, 5, 6))
    core.progress.round, core.parts.rounds.machines = 30, {}
    core.progress.phase = Phase.WAITING
    core.handle(StatusSeen(Status(0, "offline")), 1.0)
    assert not any(isinstance(a, ComputeGradient) for a in core.handle(Tick(), 1.1))  # waits: no view yet
    out = core.handle(ViewSeen(View(2, [1, 2, 3, 4, 5, 6], 2, 1, 31)), 1.3)  # the root wait: 1 s
    assert [a.round for a in out if isinstance(a, ComputeGradient)] == [30]


def test_a_drift_resync_state_that_comes_rounds_late_is_installed_with_the_updates_since() -> None:
    """Members 2 and 3 drift at once; the coordinator, the reference in that dispute, serves
    its state slowly (a loaded host sends 4.9 MB), so it lands a round or two after the round
    it was of. Dropped as stale and fetched afresh, it came late again every round: the two
    never resynced (the broker-restart test). Installed with the rounds' updates applied
    again, they are back on the fleet's model."""
    fleet = VirtualFleet(FleetConfig(nodes=4, rounds=12, length=37, allreduce=CONFIG,
                                     compute_time=0.02, latency=0.001))
    send, record_start = fleet.send, fleet.record_start
    late = 0.035  # a round takes ~0.026 s here: each state lands in the round after the next

    def slow_coordinator(agent: SimAgent, dst: int, frame: Frame) -> None:
        if frame.kind == Kind.MODEL and agent.node == 0:
            fleet.bus.call_at(fleet.clock.now() + late, partial(send, agent, dst, frame))
        else:
            send(agent, dst, frame)

    def drift(agent: SimAgent, action: ComputeGradient, grad: np.ndarray, params_hash: int) -> None:
        record_start(agent, action, grad, params_hash)
        if action.round == 3 and agent.node in (2, 3):
            agent.vector[0] += 0.5

    fleet.send, fleet.record_start = slow_coordinator, drift  # type: ignore[method-assign]
    records = fleet.run()
    assert len(set(records[4].start_hashes.values())) == 2  # the drift is there
    notes = {n: [x.detail for x in ns if x.kind == "resync"] for n, ns in records[6].notes.items()}
    assert notes.get(2) == notes.get(3) == ["state of round 5"], records[6].notes  # a round late
    assert all(len(set(r.start_hashes.values())) == 1 for r in records[7:])
    assert not any(r.degraded for r in records)


def test_a_round_that_fell_back_is_never_replayed_on_a_late_state() -> None:
    """Leaf 6 cut off in rounds 4 and 5 falls back to what it has in round 4: that update is
    not the fleet's, and a state of round 4 arriving late must not get it applied again on
    top (it is not installed: the next resync fetches a newer one)."""
    # Relayed down the tree: the root's fan-out is no link, and would bring leaf 6 the
    # fleet's mean through the cuts (tests/unit/simulate/test_virtual_fleet.py).
    faults = (*(FaultSpec("cut", 4, 6, p) for p in range(6)), *(FaultSpec("heal", 6, 6, p) for p in range(6)))
    fleet = VirtualFleet(FleetConfig(nodes=7, rounds=7, length=37, allreduce=replace(CONFIG, broadcast="tree"),
                                     faults=faults, compute_time=0.01))
    records = fleet.run()
    assert records[4].results[6].missing_chunks and not records[4].results[0].missing_chunks
    assert 4 not in fleet.agents[6].core.parts.fetch.applied
    assert sorted(fleet.agents[0].core.parts.fetch.applied) == [4, 5, 6]


def test_a_drift_resync_leans_on_the_coordinator_only_over_a_link_that_worked() -> None:
    """With 0 -> 1 cut, the coordinator's stripe never reaches node 1: a resync that waited
    for it in every pair left node 1 drifted to the end of the run (test_agent_fleet's
    one-way cut). Then the peers rotate as for a joiner."""
    core = _running_core(node=1)
    core.steps.request_resync("drift", {0}, 0.1)
    assert core.parts.fetch.transfer is not None and not core.parts.fetch.transfer.anchor_decides
    core.parts.fetch.transfer = None
    core.steps.request_resync("drift", set(), 0.2)
    assert core.parts.fetch.transfer is not None and core.parts.fetch.transfer.anchor_decides and core.parts.fetch.transfer.peer == 0


def test_a_drift_resync_replaces_a_catch_up_transfer_that_does_not_lean_on_the_coordinator() -> None:
    """A catch-up's transfer (two members showed a far-ahead round, as after a broker restart)
    asks rotating pairs; kept because it was moving, it went on asking pairs of drifted peers
    that never agreed. A drift resync takes its place, leaning on the coordinator; a second
    drift resync keeps a first one that is moving."""
    core = _running_core()
    core.handle(FrameArrived(Frame(Kind.DATA, CONFIG.job, 7, 3, 0, 5, origin=3)), 0.02)
    core.handle(FrameArrived(Frame(Kind.DATA, CONFIG.job, 7, 2, 0, 5, origin=2)), 0.03)
    assert core.parts.fetch.transfer is not None and not core.parts.fetch.transfer.anchor_decides
    core.steps.request_resync("drift", set(), 0.05)
    resync = core.parts.fetch.transfer
    assert resync is not None and resync.anchor_decides
    core.steps.request_resync("drift", set(), 0.06)
    assert core.parts.fetch.transfer is resync


def _grace_after_start(allreduce: AllreduceConfig, rtts: dict[int, float]) -> float:
    core = AgentCore(CoreConfig(node=1, rounds=50, allreduce=allreduce, state_size=4, suspicion_grace=0.4), 3)
    core.handle(ViewSeen(View(1, list(range(15)), 2, 0, 0)), 0.0)
    for peer in range(15):
        core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == 1 else 0)), 0.0)
    for peer, rtt in rtts.items():
        for _ in range(4):
            core.parts.links.observe(peer, rtt)
    core.handle(GradientReady(0, 1.0, np.ones(37, np.float32), 0), 0.01)
    return core.parts.membership.witnesses.grace


def test_the_suspicion_grace_follows_the_links_measured_with_fixed_timeouts_too() -> None:
    """A refutation crosses the broker twice: the suspect gets twice the round trip our links
    show. With fixed timeouts the grace ignored the links (1.5 s late refutations on a loaded
    host evicted five healthy agents), and the initial guess for links never used (most of a
    root's 14) added 0.1 s to every silent round."""
    adaptive = AllreduceConfig(chunk_size=8, min_timeout=0.2, initial_timeout=0.5, max_timeout=2.0)
    assert _grace_after_start(adaptive, {}) == 0.4  # nothing measured: the configured grace
    assert _grace_after_start(adaptive, {0: 0.01, 3: 0.02}) == 0.4
    assert _grace_after_start(adaptive, {0: 0.3}) == 0.6  # twice the round trip
    fixed = AllreduceConfig(chunk_size=8, timeout_mode="fixed", fixed_timeout=0.2, max_timeout=2.0)
    assert _grace_after_start(fixed, {0: 0.01}) == 0.4
    assert _grace_after_start(fixed, {0: 0.9}) >= 1.8  # the broker is slow now


def test_the_telemetry_of_a_round_counts_its_retransmits() -> None:
    """What a lossy link costs when retransmits repair it all: the report's only evidence."""
    core = _running_core()
    result = RoundResult(0, np.zeros(4, np.float32), (frozenset({0, 1}),), (), False, None,
                         RoundStats(retransmits=3, nacks=1), {})
    tel = telemetry_for(core.parts.node, core.parts.counters, RoundReport(0, 1, 4, 1.0, result, {}, []), algorithm="ft-tree",
                        model_hash=0, wall_time=1.0)
    assert tel.retransmits == 3 and tel.nacks == 1
    assert Telemetry.decode(tel.encode()).retransmits == 3


def test_busy_links_reach_every_round_machine_and_a_peers_progress_of_another_round_counts() -> None:
    adaptive = AllreduceConfig(chunk_size=8, round_deadline=1.0)
    core = _running_core(node=1)
    core.parts.config = replace(core.parts.config, allreduce=adaptive)
    machine = core.parts.rounds.machines[0]
    assert isinstance(machine, FtTreeRound)
    machine.cfg = adaptive
    # Our transport: a large frame from node 0 still arriving (link topic 0 -> 1).
    actions = core.handle(Arriving(core.parts.topics.link(0, 1)), 0.2)
    assert machine.down_busy_at == 0.2 and machine.last_heard[0] == 0.2
    assert {a.dst for a in actions if is_send(a) and a.frame.flags & Flag.PROGRESS} == {0, 2, 3}
    core.handle(Sending(), 0.3)
    assert machine.down_busy_at == 0.3
    # Node 3 is still in round 5: its PROGRESS holds our timers towards it in ours.
    core.handle(FrameArrived(Frame(Kind.PROBE, CONFIG.job, 5, 3, 0, 1, Flag.PROGRESS, target=1)), 0.4)
    assert machine.progress_from == {3: 0.4} and machine.last_heard[3] == 0.4
    assert core.parts.counters.rejected["stale_round"] == 0


def _big_frame(sender: int, round: int = 0) -> bytes:
    frame = Frame(Kind.DATA, CONFIG.job, round, sender, 0, 1, contributors=frozenset({sender}))
    return encode(frame.with_values(np.zeros(262_144, np.float32)))  # 1 MB: a chunk of the default size


BIG_FRAME_BYTES = len(_big_frame(1))
AT_6_MB_S = BIG_FRAME_BYTES / 6e6  # seconds a large frame takes to arrive on a 6 MB/s link


def _views_after_arrivals(seconds: float, *, node: int = 0, adapt: bool = True,
                          adapt_broadcast: bool = True) -> list[View]:
    """A fleet of three starting; ``node`` got eight large frames, each ``seconds`` arriving."""
    big = AllreduceConfig(chunk_size=262_144)
    core = AgentCore(CoreConfig(node=node, rounds=50, allreduce=big, state_size=4, adapt_chunks=adapt,
                                adapt_broadcast=adapt_broadcast), 3)
    core.handle(ViewSeen(View(1, [0, 1, 2], 2, 0, 0)), 0.0)
    sender = 1 if node != 1 else 0
    for _ in range(8):
        core.handle(MessageArrived(core.parts.topics.link(sender, node), _big_frame(sender), seconds), 0.1)
    assert core.parts.counters.rejected == {}
    out = []
    for peer in (0, 1, 2):
        out += core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == node else 0)), 0.2)
    return published(out, View)


def test_a_coordinator_on_a_slow_downlink_cuts_the_fleets_chunks_smaller_by_a_view() -> None:
    """1 MB chunks on a 6 MB/s link: every crossing of a chunk waits for it whole (2.3-2.5 s
    rounds against a 0.81 s bound); 32,768 values made it 1.43x."""
    slow = _views_after_arrivals(AT_6_MB_S)
    assert [(v.members, v.chunk_values, v.from_round) for v in slow] == [([0, 1, 2], SLOW_LINK_CHUNK_VALUES, 2)]
    assert _views_after_arrivals(0.001) == []  # 1 GB/s: loopback, whatever the load
    assert _views_after_arrivals(0.0) == []  # untimed
    assert _views_after_arrivals(AT_6_MB_S, adapt=False, adapt_broadcast=False) == []  # the options off
    assert _views_after_arrivals(AT_6_MB_S, node=1) == []  # not the coordinator


def test_a_coordinator_on_a_slow_downlink_has_the_root_fan_the_result_out_by_a_view() -> None:
    """Relayed down the tree, the result crosses an inner node's uplink once per child after
    its reduce (bench links: 1.49-1.67x the bound at 6-12.5 MB/s in float16/int8; the fan-out
    1.27-1.51x)."""
    slow = _views_after_arrivals(AT_6_MB_S)
    assert [(v.chunk_values, v.broadcast) for v in slow] == [(SLOW_LINK_CHUNK_VALUES, "fanout")]
    no_fanout = _views_after_arrivals(AT_6_MB_S, adapt_broadcast=False)
    assert [(v.chunk_values, v.broadcast) for v in no_fanout] == [(SLOW_LINK_CHUNK_VALUES, "")]
    only_fanout = _views_after_arrivals(AT_6_MB_S, adapt=False)
    assert [(v.chunk_values, v.broadcast) for v in only_fanout] == [(0, "fanout")]
    assert _views_after_arrivals(0.001) == []  # loopback: as configured


def test_every_round_machine_knows_our_own_links_rate_from_large_messages_arrival() -> None:
    """What wire_dtype auto narrows by besides each link's drains (agent/protocol/wire_choice.py)."""
    machine = _running_core(downlink_rate=50e6).parts.rounds.machines[0]
    assert isinstance(machine, FtTreeRound)
    assert machine.own_link_rate == pytest.approx(50e6)
    assert _running_core().parts.rounds.machines[0].own_link_rate is None  # nothing large arrived yet


def _first_round(view: View, broadcast: Broadcast = "tree", **options: Any) -> tuple[AgentCore, list[Any]]:
    """Node 2 (a leaf under the root 0) of a fleet of three configured with ``broadcast``,
    in round 0 of ``view``."""
    config = AllreduceConfig(chunk_size=8, broadcast=broadcast)
    core = AgentCore(CoreConfig(node=2, rounds=50, allreduce=config, state_size=4, **options), 3)
    core.handle(ViewSeen(view), 0.0)
    for peer in (0, 1, 2):
        core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == 2 else 0)), 0.0)
    return core, core.handle(GradientReady(0, 1.0, np.ones(4, np.float32), 0), 0.01)


def _fanned_result(round: int = 0) -> bytes:
    frame = Frame(Kind.DATA, CONFIG.job, round, 0, 0, 1, flags=Flag.BROADCAST | Flag.FINAL,
                  contributors=frozenset({0, 1, 2}), origin=0, target=NO_NODE)
    return encode(frame.with_values(np.full(4, 0.5, np.float32)))


def test_a_member_takes_the_fan_out_in_the_rounds_whose_view_says_so_and_refuses_it_in_the_others() -> None:
    core, _ = _first_round(View(1, [0, 1, 2], 2, 0, 0, broadcast="fanout"))
    assert core.parts.topics.all_fanout() in core.subscriptions()
    assert core.parts.rounds.machines[0].cfg.broadcast == "fanout"  # type: ignore[attr-defined]
    applied = [a for a in core.handle(MessageArrived(core.parts.topics.fanout(0), _fanned_result()), 0.02)
               if isinstance(a, ApplyUpdate)]
    assert core.parts.counters.rejected == {} and [a.values.tolist() for a in applied] == [[0.5] * 4]
    tree, _ = _first_round(View(1, [0, 1, 2], 2, 0, 0))
    assert tree.parts.rounds.machines[0].cfg.broadcast == "tree"  # type: ignore[attr-defined]
    assert not [a for a in tree.handle(MessageArrived(tree.parts.topics.fanout(0), _fanned_result()), 0.02)
                if isinstance(a, ApplyUpdate)]
    assert dict(tree.parts.counters.rejected) == {"fanout_in_tree_round": 1}
    quiet, _ = _first_round(View(1, [0, 1, 2], 2, 0, 0), adapt_broadcast=False)
    assert quiet.parts.topics.all_fanout() not in quiet.subscriptions()  # nothing can switch it
    fanout, _ = _first_round(View(1, [0, 1, 2], 2, 0, 0), broadcast="fanout")  # the default
    assert fanout.parts.rounds.machines[0].cfg.broadcast == "fanout"  # type: ignore[attr-defined]
    assert fanout.parts.topics.all_fanout() in fanout.subscriptions()
    assert [a.values.tolist() for a in fanout.handle(MessageArrived(fanout.parts.topics.fanout(0), _fanned_result()), 0.02)
            if isinstance(a, ApplyUpdate)] == [[0.5] * 4]


def _chunk_counts_sent(view: View) -> set[int]:
    big = AllreduceConfig(chunk_size=262_144)
    core = AgentCore(CoreConfig(node=1, rounds=50, allreduce=big, state_size=4), 3)
    core.handle(ViewSeen(view), 0.0)
    for peer in (0, 1, 2):
        core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == 1 else 0)), 0.0)
    actions = core.handle(GradientReady(0, 1.0, np.ones(100_000, np.float32), 0), 0.01)
    return {a.frame.chunk_count for a in actions if is_send(a)}


def test_every_member_cuts_the_vector_as_the_view_of_the_round_says() -> None:
    assert _chunk_counts_sent(View(1, [0, 1, 2], 2, 0, 0)) == {1}  # the configured 262,144
    assert _chunk_counts_sent(View(1, [0, 1, 2], 2, 0, 0, chunk_values=32_768)) == {4}


def test_the_telemetry_of_a_round_says_which_wire_formats_its_frames_of_values_used() -> None:
    core = _running_core()
    stats = RoundStats(wire_frames={"float32": 2, "int8": 4})
    result = RoundResult(0, np.zeros(4, np.float32), (frozenset({0, 1}),), (), False, None, stats, {})
    tel = telemetry_for(core.parts.node, core.parts.counters, RoundReport(0, 1, 4, 1.0, result, {}, []), algorithm="ft-tree",
                        model_hash=0, wall_time=1.0)
    assert Telemetry.decode(tel.encode()).wire_frames == {"float32": 2, "int8": 4}
    none = telemetry_for(core.parts.node, core.parts.counters, RoundReport(0, 1, 4, 1.0, None, {}, []), algorithm="ft-tree",
                         model_hash=0, wall_time=1.0)
    assert none.wire_frames == {}


# -- one device's credentials against the control plane (issue 38) ----------------------------


def test_a_status_speaking_for_another_node_is_refused_and_counted() -> None:
    core = _running_core(node=0)
    # On node 3's own topic: "node 0 is offline, a newer life": it made node 0 exit (code 4).
    forged = Status(0, "offline", incarnation=99).encode()
    assert core.handle(MessageArrived(core.parts.topics.status(3), forged), 0.02) == []
    assert core.phase != Phase.DONE and core.parts.counters.rejected["status_forged"] == 1
    honest = Status(3, "offline", incarnation=1).encode()  # node 3's own, on its own topic
    core.handle(MessageArrived(core.parts.topics.status(3), honest), 0.03)
    assert core.parts.membership.states[3] == "offline" and core.parts.counters.rejected["status_forged"] == 1


def test_a_suspicion_beyond_the_next_round_is_refused_and_counted() -> None:
    core = _running_core(node=0)
    topics = core.parts.topics
    core.handle(MessageArrived(topics.suspect(3), Suspect(3, 10**6, 1).encode()), 0.02)
    assert core.parts.counters.rejected["suspect_future_round"] == 1 and 1 not in core.parts.membership.witnesses.reports
    core.handle(MessageArrived(topics.suspect(3), Suspect(3, 1, 1).encode()), 0.03)  # the next round
    assert 1 in core.parts.membership.witnesses.reports and core.parts.counters.rejected["suspect_future_round"] == 1


def _unit(sender: int, j: int, ids: set[int], core: AgentCore, **fields: Any) -> Frame:
    machine = core.parts.rounds.machines[0]
    assert isinstance(machine, FtTreeRound)
    lo, hi = machine.scope.bounds[j]
    frame = Frame(Kind.DATA, CONFIG.job, 0, sender, j, machine.n, contributors=frozenset(ids), **fields)
    return frame.with_values(np.ones(hi - lo, np.float32))


def test_a_unit_claiming_contributors_outside_its_senders_subtree_is_refused_and_counted() -> None:
    core = _running_core(node=0)  # the root: 1 and 2 below it, 3 below 1
    core.handle(FrameArrived(_unit(3, 0, {1, 2, 3}, core)), 0.02)  # straight to the root (an ancestor)
    machine = core.parts.rounds.machines[0]
    assert isinstance(machine, FtTreeRound)
    assert machine.reducer.covered(0) == {0} and core.parts.counters.rejected["contributors_outside_subtree"] == 1
    core.handle(FrameArrived(_unit(3, 0, {3}, core)), 0.03)  # its own contribution: counted
    assert machine.reducer.covered(0) == {0, 3}


def test_a_result_from_a_node_that_is_not_above_us_is_refused_and_counted() -> None:
    core = _running_core(node=2)  # 2's parent is 0; 3 is a leaf below 1
    machine = core.parts.rounds.machines[0]
    assert isinstance(machine, FtTreeRound)
    core.handle(FrameArrived(_unit(3, 0, {0, 1, 2, 3}, core, flags=Flag.BROADCAST | Flag.FINAL, target=2)), 0.02)
    assert not machine.results.has(0) and core.parts.counters.rejected["result_not_from_above"] == 1
    core.handle(FrameArrived(_unit(0, 0, {0, 1, 2, 3}, core, flags=Flag.BROADCAST | Flag.FINAL, target=2)), 0.03)
    assert machine.results.has(0) and core.parts.counters.rejected["result_not_from_above"] == 1
