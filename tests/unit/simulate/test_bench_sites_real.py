"""bench sites --real's figures from a run's uplink counters, rounds and telemetry."""

from __future__ import annotations

from typing import Any

from simulate.bench.sites_real import (
    WARMUP_ROUNDS,
    busy_share,
    cpu_jiffies,
    fault_figures,
    round_figures,
    round_parts,
    uplink_figures,
)

VALUES = 1000  # 4000-byte vectors
V = 4000


def _snapshots(per_round: dict[str, tuple[int, int]], rounds: int) -> list[tuple[int, dict[str, list[int]]]]:
    startup = {site: [50_000, 70_000] for site in per_round}  # joins and state before round 0
    return [(r, {s: [startup[s][0] + r * up, startup[s][1] + r * down] for s, (up, down) in per_round.items()})
            for r in range(rounds + 1)]


def test_uplink_figures_count_bytes_into_the_sites_past_the_warm_up() -> None:
    # site-aware with the fan-out: s0 takes both means in and sends the result up once
    per_round = {"s0": (V, 2 * V), "s1": (V, V), "s2": (V, V)}
    got = uplink_figures(_snapshots(per_round, 20), 20, 3, VALUES, rate=10e6, rtt=0.04)
    assert got["minimum_bytes_per_round"] == 4 * V
    assert got["into_sites_bytes_per_round"] == 4 * V and got["over_minimum"] == 1.0
    assert got["both_ways_bytes_per_round"] == 7 * V
    assert got["busiest_uplink_bytes_per_round_each_way"] == 2 * V
    assert got["uplink_bound_s"] == round(2 * V / 10e6 + 0.08, 3)
    assert got["measured_rounds"] == [WARMUP_ROUNDS, 20]


def test_uplink_figures_say_so_without_two_rounds_to_compare() -> None:
    assert "error" in uplink_figures([(0, {"s0": [1, 1]})], 20, 2, VALUES, 10e6, 0.04)


def test_round_figures_take_the_median_past_the_warm_up_and_count_degraded_rounds() -> None:
    rows = [{"round": r, "round_s_max": 5.0 if r < WARMUP_ROUNDS else 0.5 + r / 100,
             "compute_s_median": 0.1, "degraded_nodes": 3 if r == 7 else 0} for r in range(14)]
    got = round_figures(rows, bound=0.4)
    assert got["median_round_s"] == 0.58  # rounds 3..13: 0.53..0.63
    assert got["over_bound"] == round(0.58 / 0.4, 3)
    assert got["degraded_rounds"] == 1 and got["compute_share"] == round(0.1 / 0.58, 3)


def _telemetry(t: float, rnd: int, node: int, model: str, contributors: int = 6,
               degraded: bool = False) -> dict[str, Any]:
    return {"type": "telemetry", "t": t, "round": rnd, "node": node, "model_hash": model,
            "contributors": contributors, "degraded": degraded}


def _cut_run(second_fleet: bool) -> list[dict[str, Any]]:
    """6 agents, site s1 = 3, 4, 5 cut from t=10 to t=30; rounds every 1 s."""
    events: list[dict[str, Any]] = [{"type": "fault", "action": "inject", "t": 10.0},
                                    {"type": "site", "event": "healed", "t": 30.0}]
    for r in range(40):
        t = float(r)
        for node in range(6):
            cut = node >= 3 and 10 <= t < 32  # back two rounds after the heal
            if cut and not second_fleet:
                continue  # the cut-off site waits: no rounds
            model = f"s1-{r}" if cut else f"fleet-{r}"
            events.append(_telemetry(t + node / 100, r, node, model, 3 if cut else 6, degraded=(node == 0 and r == 3)))
    return events


def test_fault_figures_a_site_that_waits_and_comes_back() -> None:
    got = fault_figures(_cut_run(second_fleet=False), {3, 4, 5}, 6)
    assert got["fault_s"] == 20.0 and got["rounds_in_fault"] == 20
    assert got["others_degraded_rounds"] == []  # round 3's degraded report is before the fault
    assert got["split_rounds"] == []
    assert got["first_round_after_heal"] == 30 and got["back_in_rounds"] == 2 and got["back_in_s"] == 2.0
    assert got["site_heard_s"] is None  # no status of s1 after the heal
    assert got["back_after_heard_rounds"] is None


def test_fault_figures_time_the_cut_sites_first_status_after_the_heal() -> None:
    statuses = [{"type": "status", "t": t, "node": node} for t, node in ((12.0, 3), (30.5, 0), (31.25, 4))]
    got = fault_figures(_cut_run(second_fleet=False) + statuses, {3, 4, 5}, 6)
    assert got["site_heard_s"] == 1.25
    # heard at 31.25: round 32 is the first begun after it, and the site is back in round 32
    assert got["back_in_rounds"] == 2 and got["back_after_heard_rounds"] == 0
    later = [{"type": "status", "t": 30.5, "node": 5}]
    assert fault_figures(_cut_run(second_fleet=False) + later, {3, 4, 5}, 6)["back_after_heard_rounds"] == 1


def test_fault_figures_a_second_fleet_is_a_split() -> None:
    got = fault_figures(_cut_run(second_fleet=True), {3, 4, 5}, 6)
    assert got["split_rounds"] == list(range(10, 32))


def test_fault_figures_a_round_cut_short_in_the_fleets_broadcast_is_no_split() -> None:
    # s1's broker stopped mid-broadcast: its members kept the fleet's mean for the chunks that
    # came and skipped the rest (degraded, every member a contributor): not another fleet.
    events = _cut_run(second_fleet=False)
    events += [{**_telemetry(10.5, 10, n, "fleet-10-partial", degraded=True), "members": 6} for n in (3, 4, 5)]
    assert fault_figures(events, {3, 4, 5}, 6)["split_rounds"] == []
    minority = [{**_telemetry(10.5, 10, n, "s1-10", contributors=3, degraded=True), "members": 6} for n in (3, 4, 5)]
    assert fault_figures(_cut_run(second_fleet=False) + minority, {3, 4, 5}, 6)["split_rounds"] == [10]


def test_fault_figures_say_so_when_the_fault_never_ended() -> None:
    assert "error" in fault_figures([{"type": "fault", "action": "inject", "t": 1.0}], {1}, 2)


def test_the_hosts_cpu_busy_share_leaves_idle_and_iowait_out() -> None:
    before = cpu_jiffies("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n")
    after = cpu_jiffies("cpu  400 0 200 800 100 0 0 0 0 0\n")
    assert before == (200, 1000) and after == (600, 1500)
    assert busy_share(before, after) == 0.8  # 400 of 500 jiffies busy
    assert busy_share(after, after) is None
    busy, total = cpu_jiffies()  # this host's
    assert 0 <= busy <= total


def _round(rnd: int, start: float, end: float) -> list[dict[str, Any]]:
    """Two agents' reports of a round that ran from ``start`` to ``end``."""
    return [{"type": "telemetry", "round": rnd, "node": n, "wall_time": at,
             "phase_seconds": {"total": at - begin}} for n, (begin, at) in enumerate(((start, end - 0.01), (start + 0.02, end)))]


def test_round_parts_split_a_round_at_its_first_vector_byte_up_and_last_one_down() -> None:
    trace: dict[str, dict[str, list[list[float]]]] = {
        # the root's site: its bytes never count (its uplink takes the means, sends the result up)
        "s0": {"up": [[100.05, 65536]], "down": [[100.02, 65536]]},
        "s1": {"up": [[100.01, 2000],  # telemetry and ACKs: not the mean
                      [100.2, 65536], [100.3, 65536]],
               "down": [[100.03, 65536],  # the last round's result, still coming in
                        [100.5, 65536], [100.58, 65536], [100.7, 900]]},
        "s2": {"up": [[100.25, 65536]], "down": [[100.6, 65536]]},
    }
    events = _round(WARMUP_ROUNDS, 100.0, 100.7) + _round(WARMUP_ROUNDS - 1, 99.0, 99.9)
    got = round_parts(trace, events, "s0")
    assert got["rounds"] == 1  # the warm-up round is not measured
    assert (got["in_site_start_s"], got["crossing_s"], got["in_site_end_s"]) == (0.2, 0.4, 0.1)


def test_round_parts_say_so_without_a_round_that_crossed_both_ways() -> None:
    trace: dict[str, dict[str, list[list[float]]]] = {"s0": {"up": [], "down": []},
                                                      "s1": {"up": [[100.2, 65536]], "down": []}}
    assert "error" in round_parts(trace, _round(WARMUP_ROUNDS, 100.0, 100.7), "s0")
    assert "error" in round_parts({}, _round(WARMUP_ROUNDS, 100.0, 100.7), "s0")
