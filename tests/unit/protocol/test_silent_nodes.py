"""Silent nodes (frozen, connection open): found by the fleet's witnesses, routed around, taken
back when they resume. In memory, on the agent core, adaptive timeouts as users run them."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.config import AgentConfig
from agent.protocol.allreduce import AllreduceConfig
from agent.runtime_config import allreduce_config
from simulate.virtual_fleet import (
    FaultSpec,
    FleetConfig,
    Phase,
    RoundRecord,
    VirtualFleet,
    count_problems,
)

CONFIG = AllreduceConfig(chunk_size=4096, min_timeout=0.05, max_timeout=1.0, initial_timeout=0.2,
                         round_deadline=3.0)
COMPUTE = 0.1
ROLES = {"root": 0, "inner": 1, "leaf": 6}


def run(faults: tuple[FaultSpec, ...], rounds: int = 45, will_delay: float = 30.0,
        nodes: int = 7) -> list[RoundRecord]:
    fleet = VirtualFleet(FleetConfig(nodes=nodes, rounds=rounds, length=20_000, allreduce=CONFIG,
                                     faults=faults, will_delay=will_delay, compute_time=COMPUTE,
                                     keep_gradients=True, latency=0.0005, max_time=600.0))
    return _records_of(fleet)


def _records_of(fleet: VirtualFleet) -> list[RoundRecord]:
    """The fleet's records; the fleet itself is let go at once (a test runs two or more)."""
    records = fleet.run()
    fleet.release()
    return records


def survivors_time(rec: RoundRecord, silent: int) -> float:
    return max(res.finished_at - rec.starts[n] for n, res in rec.results.items() if n != silent)


@pytest.mark.parametrize("will", ["no_will", "will"])
@pytest.mark.parametrize("role", list(ROLES))
def test_a_hung_node_costs_one_short_round_then_the_fleet_runs_without_it(role: str, will: str) -> None:
    node = ROLES[role]
    base = statistics.median(survivors_time(r, -1) for r in run(())[5:])
    # Frozen 0.01 s into round 5 (mid-reduce) for 2 s; the Will fires after 0.5 s, or never.
    faults = (FaultSpec("hang", 5, node, after=0.01), FaultSpec("resume", 5, node, after=2.0))
    records = run(faults, will_delay=0.5 if will == "will" else 30.0)
    assert [r.round for r in records] == list(range(45)), "the fleet halted"
    hang_at = records[5].start + 0.01
    resume_at = hang_at + 2.0 - 0.01
    # The round it froze in (a round here is shorter than 0.01 s: often the next one).
    silent_round = next(r for r in records if r.start + survivors_time(r, node) > hang_at)
    assert survivors_time(silent_round, node) <= base + 1.0
    while_silent = [r for r in records[silent_round.round + 1 :]
                    if r.start + survivors_time(r, node) < resume_at]
    assert len(while_silent) >= 5
    for rec in while_silent:
        assert survivors_time(rec, node) <= 1.5 * base + 0.01, rec.round  # 10 ms: event grain
        assert not any(res.degraded for n, res in rec.results.items() if n != node), rec.round
        assert len({h for n, h in rec.start_hashes.items() if n != node}) == 1, rec.round
    assert node not in while_silent[2].members  # a view keeps it at most two rounds
    back = [r for r in records if r.start > resume_at and node in r.results]
    assert back, "never back"
    first_back = back[0]
    rounds_to_rejoin = first_back.round - next(r.round for r in records if r.start > resume_at)
    assert rounds_to_rejoin <= 5
    for rec in records[first_back.round :]:
        assert node in rec.members and len(set(rec.start_hashes.values())) == 1, rec.round
        assert survivors_time(rec, -1) <= 1.5 * base + 0.01, rec.round
    for rec in records:
        assert count_problems(rec, CONFIG.chunk_size) == [], rec.round


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hangs=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 12), st.floats(0.0, 0.2),
                                st.floats(0.05, 2.5)), min_size=1, max_size=3),
       will=st.booleans())
# Found by hypothesis: 2 froze while the view taking 3 back was pending; the coordinator let
# that view take effect first, and 2 stayed in the view for four rounds.
@example(hangs=[(0, 1, 0.125, 1.0), (2, 12, 0.0, 1.0), (3, 1, 0.0, 1.75)], will=False)
def test_any_hangs_and_resumes_never_halt_never_double_count_and_views_drop_the_silent(
    hangs: list[tuple[int, int, float, float]], will: bool
) -> None:
    faults: list[FaultSpec] = []
    for node, rnd, after, length in hangs:
        faults += [FaultSpec("hang", rnd, node, after=after), FaultSpec("resume", rnd, node, after=after + length)]
    records = run(tuple(faults), rounds=30, will_delay=0.7 if will else 30.0)
    assert [r.round for r in records] == list(range(30)), "the fleet halted"
    for rec in records:
        assert count_problems(rec, CONFIG.chunk_size) == [], rec.round
    for node, rnd, after, length in hangs:
        if sum(1 for n, *_ in hangs if n == node) > 1:
            continue  # overlapping hangs of one node: the simple window below does not apply
        hang_at = records[rnd].start + after if rnd < len(records) else None
        if hang_at is None:
            continue
        silent = [r for r in records if r.start >= hang_at and r.start + 0.2 < hang_at + length]
        for k, rec in enumerate(silent):
            # The round it froze in, and two more while the new view comes; a round that
            # started just before the resume may have it back already (then it trains in it).
            if k >= 3:
                assert node not in rec.members or node in rec.results, (node, rec.round, rec.members)


# The agent's own defaults (agent/config.py through agent/core_config.py), the real model's
# length and 1 MB units: what a user runs, not a tuned harness. Links measured fast (loopback
# here) must not wait half a second per MB queued before calling a frozen peer silent, and a
# unit a sibling relays to a parent the fleet found silent moves on at once (issue 12).
AGENT_CONFIG = allreduce_config(AgentConfig(id=0))
REAL_LENGTH = 407_050


def _agent_defaults_run(faults: tuple[FaultSpec, ...], rounds: int, reconnect_delay: float = 0.02,
                        compute_jitter: float = 0.0, nodes: int = 7) -> list[RoundRecord]:
    return _records_of(VirtualFleet(FleetConfig(
        nodes=nodes, rounds=rounds, length=REAL_LENGTH, allreduce=AGENT_CONFIG, faults=faults,
        will_delay=15.0, offline_settle=1.0, compute_time=0.03, compute_jitter=compute_jitter,
        latency=0.0005, broker_bandwidth=300e6, max_time=600.0, reconnect_delay=reconnect_delay)))


def _fault_free_median(jitter: float) -> float:
    return statistics.median(survivors_time(r, -1) for r in _agent_defaults_run((), 12, compute_jitter=jitter)[3:])


@pytest.fixture(scope="module")
def agent_defaults_median() -> float:
    return statistics.median(survivors_time(r, -1) for r in _agent_defaults_run((), 12)[3:])


@pytest.mark.parametrize("phase", ["reduce", "broadcast"])
@pytest.mark.parametrize("role", list(ROLES))
def test_with_the_agents_defaults_the_round_a_node_freezes_in_costs_under_a_second(
    role: str, phase: Phase, agent_defaults_median: float
) -> None:
    """Frozen mid-reduce, or once its contribution is sent (the broadcast: its parent's
    machine of that round, lingering for its ACKs, reports it silent again while the next
    round waits for it; that report must not restart the first one's grace)."""
    node = ROLES[role]
    faults = (FaultSpec("hang", 8, node, phase=phase, after=0.01), FaultSpec("resume", 8, node, after=3.0))
    records = _agent_defaults_run(faults, 16)
    assert [r.round for r in records] == list(range(16)), "the fleet halted"
    # Frozen in the broadcast, it is silent from the next round's start: that round counts
    # as the one it goes silent in (as in `bench silent`). So is a node frozen 10 ms into a
    # fan-out round: it had the result by then (relayed, the result took ~25 ms here).
    silent = _silent_from(records, node, 8)
    assert silent in ((8, 9) if phase == "reduce" else (9,)), silent
    first_routed = silent + 1
    for rec in records[8:first_routed]:
        assert survivors_time(rec, node) <= agent_defaults_median + 1.0, (rec.round, survivors_time(rec, node))
    for rec in records[first_routed:first_routed + 4]:  # still frozen: routed around, then out of the view
        assert survivors_time(rec, node) <= 1.5 * agent_defaults_median + 0.01, rec.round
        assert not any(res.degraded for n, res in rec.results.items() if n != node), rec.round
    assert node not in records[first_routed + 1].members


def _silent_from(records: list[RoundRecord], node: int, first: int) -> int:
    """The round a frozen ``node`` goes silent in: the first from ``first`` on that it ended
    no more (it froze before its result came)."""
    return next(r.round for r in records[first:] if node not in r.results)


def _forwarded_to(rec: RoundRecord, node: int) -> set[int]:
    """Members that relayed (or forwarded a flood of) something to ``node`` in that round."""
    return {n for n, notes in rec.notes.items() for x in notes if x.kind == "relay" and x.detail == f"to {node}"}


@pytest.mark.parametrize("role", ["root", "inner", "leaf"])
def test_at_15_agents_a_frozen_node_costs_one_short_round_and_the_next_ones_run_at_speed(role: str) -> None:
    """15 agents, the agents' defaults, a node frozen 10 ms into round 8. A frozen leaf's
    parent used to flood the broadcast to it when its relay failed: every member forwarded
    it a whole vector (21 MB) while the verdict on the leaf came, which made that round and
    the next one slow (0.79 s, then 0.25 s against a 0.14 s median)."""
    node = {"root": 0, "inner": 1, "leaf": 14}[role]
    median = statistics.median(survivors_time(r, -1) for r in _agent_defaults_run((), 12, nodes=15)[3:])
    faults = (FaultSpec("hang", 8, node, after=0.01), FaultSpec("resume", 8, node, after=3.0))
    records = _agent_defaults_run(faults, 13, nodes=15)
    assert [r.round for r in records] == list(range(13)), "the fleet halted"
    silent = _silent_from(records, node, 8)  # 9: it had round 8's result (see above)
    assert silent in (8, 9), silent
    assert survivors_time(records[silent], node) <= median + 1.0
    for rec in records[silent + 1 : silent + 4]:
        assert survivors_time(rec, node) <= 1.5 * median + 0.01, (rec.round, survivors_time(rec, node), median)
        assert not any(res.degraded for n, res in rec.results.items() if n != node), rec.round
    assert node not in records[silent + 2].members
    if role == "leaf":
        assert _forwarded_to(records[silent], node) <= {13}, "flooded"  # its sibling's relay only


@pytest.mark.parametrize("nodes", [7, 15])
def test_a_crashed_root_costs_the_wills_settle_not_the_dead_roots_whole_wait(nodes: int) -> None:
    """The root crashes in round 8; its Will settles for 1 s, as on a real agent. The new
    coordinator's view used to come for the round after next, so the next round waited on the
    dead root's tree for the whole root wait (the round deadline, 5 s) on every member, and
    no report showed it (the allreduce phase is short)."""
    fleet = VirtualFleet(FleetConfig(
        nodes=nodes, rounds=14, length=REAL_LENGTH, allreduce=AGENT_CONFIG, faults=(FaultSpec("crash", 8, 0, after=0.02),),
        will_delay=15.0, offline_settle=1.0, compute_time=0.03, latency=0.0005,
        broker_bandwidth=300e6, max_time=600.0))
    records = fleet.run()
    assert [r.round for r in records] == list(range(14)), "the fleet halted"
    gap = records[9].start - records[8].start
    assert gap < 1.0 + 0.5, gap  # the settle, then the new tree at once (before: 5 s)
    assert 0 not in records[9].members
    for rec in records[9:]:
        assert len(set(rec.start_hashes.values())) == 1, rec.round


FLAP_AFTER = (0.0, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06)  # into the round's phase


@pytest.mark.parametrize("jitter", [0.0, 0.04])
@pytest.mark.parametrize("phase", ["reduce", "broadcast"])
@pytest.mark.parametrize("role", list(ROLES))
def test_with_the_agents_defaults_a_flapping_connection_costs_no_wait(
    role: str, phase: Phase, jitter: float, agent_defaults_median: float
) -> None:
    """Eight drops, each back after 80 ms (paho's reconnects on the real fleet took 20-140
    ms), at points spread over the round. A drop long enough for the fleet to start the next
    round around the node left it waiting a whole wait in the round the fleet had ended
    (its children had gone on), and the fleet's next round waiting for it: 2.5 s rounds.
    With each agent's gradient up to 40 ms late (``jitter``: on the real fleet they start a
    round each at its own moment), some children had gone around the node and some had not,
    and it waited for the first kind: 0.5 s rounds."""
    node = ROLES[role]
    faults = tuple(FaultSpec("flap", 4 + 3 * i, node, phase=phase, after=after, value=1)
                   for i, after in enumerate(FLAP_AFTER))
    rounds = 4 + 3 * len(FLAP_AFTER) + 4
    records = _agent_defaults_run(faults, rounds, reconnect_delay=0.08, compute_jitter=jitter)
    assert [r.round for r in records] == list(range(rounds)), "the fleet halted"
    # Against the same fleet without faults, gradients as late: a round ends with its last
    # gradient, so the jitter alone lengthens every round (with the fan-out's 38 ms rounds,
    # rounds 70-80 ms long only by the jitter counted as slow against the unjittered median).
    median = agent_defaults_median if jitter == 0 else _fault_free_median(jitter)
    limit = 1.5 * median + 0.01  # 10 ms: event grain
    away = 0.0
    if role == "root":
        # Nobody else can average the round: the fleet waits out the root's 80 ms away
        # (ROOT_WILL_GRACE) instead of skipping the round, so no round is degraded and no
        # member drifts (a skipped round's chunks differed between members: state transfers).
        away = 0.08
        limit += away
        assert [r.round for r in records if r.degraded] == []
        assert [r.round for r in records if len(set(r.start_hashes.values())) > 1] == []
    slow = [(r.round, round(survivors_time(r, node), 3)) for r in records if survivors_time(r, node) > limit]
    # A drop still costs its own round something (units in flight lost and asked for again,
    # the result fetched twice): up to half the drops here give a round over 1.5x (at most
    # 2x), more than the "at most 2". What may never come back is a wait for the
    # node: no round near a timeout.
    assert len(slow) <= len(FLAP_AFTER) // 2, slow
    worst = max(survivors_time(r, node) for r in records)
    assert worst <= 3 * median + away + 0.01, slow
    last = records[-1]
    assert node in last.members and node in last.results
    assert len(set(last.start_hashes.values())) == 1, last.start_hashes


FLAP_SWEEP = tuple(i * 0.004 for i in range(30))  # every 4 ms of a round's first 120 ms


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["reduce", "broadcast"])
def test_an_inner_node_back_within_10_ms_costs_no_wait_wherever_the_drop_falls(
    phase: Phase, agent_defaults_median: float
) -> None:
    """Thirty 10 ms drops of an inner node (as its proxy cut it on the real fleet), each at
    another point of its round, gradients up to 40 ms apart. Two ways a drop cost a whole
    wait, both seen on real mosquitto (1.5 s rounds) and here (1.7 s and 2.5 s, degraded):
    - back between rounds, the node waited for a child that had sent around it on its Will;
    - a child had sent around it what it had ACKed (``Uplink.resend_custody``), and the root
      refused the node's subtree mean as overlapping that unit, then waited for the rest of
      the subtree until its wait ran out."""
    node = ROLES["inner"]
    faults = tuple(FaultSpec("flap", 4 + 3 * i, node, phase=phase, after=after, value=1)
                   for i, after in enumerate(FLAP_SWEEP))
    rounds = 4 + 3 * len(FLAP_SWEEP) + 3
    records = _agent_defaults_run(faults, rounds, reconnect_delay=0.01, compute_jitter=0.04)
    assert [r.round for r in records] == list(range(rounds)), "the fleet halted"
    # 3x: the jitter alone spreads rounds by 40 ms; a wait is 0.2 s and more.
    slow = [(r.round, round(survivors_time(r, node), 3)) for r in records
            if survivors_time(r, node) > 3 * agent_defaults_median + 0.04]
    assert slow == [], slow
    # Whoever else the fleet averaged, it never left out a member whose connection held
    # (the flapping node itself may miss a round: the fleet ran it around it, on its Will).
    others = set(range(7)) - {node}
    lacking = [(r.round, n) for r in records for n, res in r.results.items()
               if any(not others <= ids for ids in res.contributors)]
    assert lacking == [], lacking
    assert len(set(records[-1].start_hashes.values())) == 1


@pytest.mark.parametrize("phase", ["reduce", "broadcast"])
def test_a_root_away_longer_than_a_timeout_but_within_its_grace_is_waited_for_not_declared_dead(
    phase: Phase, agent_defaults_median: float
) -> None:
    """The root's connection drops for 300 ms (longer than the RTO, within ROOT_WILL_GRACE)
    at five points of a round. Its Will explains the silence: its children must not time
    out on it, relay around it, report it silent (two witnesses would evict a healthy root)
    or give its units up; when it is back everything goes to it again and the round ends
    whole. Before the grace every such drop skipped the round (degraded, members drifted)."""
    faults = tuple(FaultSpec("flap", 4 + 3 * i, 0, phase=phase, after=after, value=1)
                   for i, after in enumerate((0.0, 0.01, 0.02, 0.03, 0.05)))
    rounds = 4 + 3 * 5 + 3
    records = _agent_defaults_run(faults, rounds, reconnect_delay=0.3, compute_jitter=0.04)
    assert [r.round for r in records] == list(range(rounds)), "the fleet halted"
    assert [r.round for r in records if r.degraded] == []
    assert [r.round for r in records if len(set(r.start_hashes.values())) > 1] == []
    verdicts = [(r.round, n, note.kind) for r in records for n, notes in r.notes.items() for note in notes
                if note.peer == 0 and note.kind in ("silent", "link_dead", "undeliverable", "root_down")]
    assert verdicts == []
    assert max(survivors_time(r, 0) for r in records) <= 0.3 + 2 * agent_defaults_median + 0.04
