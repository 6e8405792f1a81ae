"""The in-memory fleet with sites: the site-aware tree crosses sites with one vector per site
and direction, and the fault-tolerant rules hold inside a site and across sites."""

from __future__ import annotations

import pytest

from agent.core.actions import Publish
from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.chunking import SLOW_LINK_BROADCAST, SLOW_LINK_CHUNK_VALUES
from agent.protocol.membership import view_tree
from agent.protocol.wire import Frame, Kind
from simulate.virtual_fleet import FaultSpec, FleetConfig, SimAgent, VirtualFleet, count_problems

LENGTH = 400
FAST = AllreduceConfig(chunk_size=100, timeout_mode="fixed", fixed_timeout=0.05, round_deadline=1.0,
                       broadcast="tree")


def _fleet(**kw: object) -> VirtualFleet:
    options: dict[str, object] = dict(nodes=21, rounds=3, length=LENGTH, allreduce=FAST, sites=3,
                                      keep_gradients=True, adapt_broadcast=False, adapt_chunks=False)
    return VirtualFleet(FleetConfig(**{**options, **kw}))  # type: ignore[arg-type]


def test_site_blocks_match_make_sites() -> None:
    config = FleetConfig(nodes=7, sites=3)
    assert [config.site_of(n) for n in range(7)] == ["s0"] * 3 + ["s1"] * 2 + ["s2"] * 2


def test_site_aware_rounds_cross_sites_with_one_vector_per_site_and_direction() -> None:
    aware, blind = _fleet(), _fleet(site_aware=False)
    records, blind_records = aware.run(), blind.run()
    for rec in records:
        assert not rec.degraded and count_problems(rec, 100) == []
    vector = LENGTH * 4  # float32 values
    # 2 non-root sites x (their mean up + the result down), plus frame headers and ACKs
    minimum = 3 * 2 * 2 * vector
    assert minimum <= aware.cross_site_bytes <= 1.3 * minimum
    assert blind.cross_site_bytes > 2 * aware.cross_site_bytes
    for rec, other in zip(records, blind_records, strict=True):  # the same mean, summed otherwise
        assert abs(rec.results[0].values - other.results[0].values).max() < 1e-5


def test_a_crashed_site_root_is_replaced_from_its_site_and_the_fleet_goes_on() -> None:
    fleet = _fleet(rounds=6, faults=(FaultSpec("crash", 1, 7),))
    records = fleet.run()
    last = records[-1]
    assert 7 not in last.members and not last.degraded and count_problems(last, 100) == []
    tree = view_tree(fleet.agents[0].core.parts.membership.views.newest)
    assert tree.site_root(8) == 8 and tree.parent(8) == 0
    assert len({r.values.tobytes() for r in last.results.values()}) == 1


def test_a_silent_node_inside_a_site_is_detected_and_routed_around() -> None:
    records = _fleet(rounds=6, faults=(FaultSpec("hang", 1, 10),)).run()
    last = records[-1]
    assert 10 not in last.members and not last.degraded
    assert len({r.values.tobytes() for r in last.results.values()}) == 1


def test_a_fleet_over_sites_cuts_small_chunks_and_fans_out_from_the_start() -> None:
    # The coordinator's site broker hands it every message at local speed: its downlink never
    # shows the uplinks slow, so the view's sites decide.
    config = AllreduceConfig(timeout_mode="fixed", fixed_timeout=0.05, round_deadline=1.0, broadcast="tree")
    aware = _fleet(nodes=6, sites=2, rounds=3, allreduce=config, adapt_broadcast=True, adapt_chunks=True)
    blind = _fleet(nodes=6, sites=2, rounds=3, allreduce=config, adapt_broadcast=True, adapt_chunks=True,
                   site_aware=False)
    aware.run()
    blind.run()
    view = aware.agents[0].core.parts.membership.views.newest
    assert (view.chunk_values, view.broadcast) == (SLOW_LINK_CHUNK_VALUES, SLOW_LINK_BROADCAST)
    assert blind.agents[0].core.parts.membership.views.newest.chunk_values == 0


@pytest.mark.slow
def test_a_site_back_from_a_cut_takes_the_state_across_once_not_once_per_agent() -> None:
    fleet = VirtualFleet(FleetConfig(
        nodes=15, rounds=60, length=2000, sites=3, compute_time=0.02,
        allreduce=AllreduceConfig(chunk_size=64, timeout_mode="fixed", fixed_timeout=0.05, round_deadline=1.0),
        faults=tuple(FaultSpec(action, at, n) for action, at in (("isolate", 5), ("restore", 30))
                     for n in range(10, 15))))
    state_across = 0
    put = fleet._put

    def counting(agent: SimAgent, action: Publish) -> None:
        nonlocal state_across
        frame = action.message
        if (isinstance(frame, Frame) and frame.kind is Kind.MODEL and action.dst is not None
                and fleet.config.site_of(agent.node) != fleet.config.site_of(action.dst)):
            state_across += len(action.payload())
        put(agent, action)

    fleet._put = counting  # type: ignore[method-assign]
    records = fleet.run()
    state = 2 * 2000 * 4  # params and momentum, float32
    assert state_across < 2 * state, state_across / state  # it was 5.9 states, one per agent
    back = [rec for rec in records if rec.round > 30 and set(range(10, 15)) <= set(rec.start_hashes)]
    assert back and back[0].round <= 35, [rec.round for rec in back[:3]]
    assert all(len(set(rec.start_hashes.values())) == 1 for rec in back)
