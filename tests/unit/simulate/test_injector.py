"""simulate/injector.py: how faults are planned, and the namespaces' address slots."""

from __future__ import annotations

import pytest

from simulate import injector
from simulate.injector import free_slot, namespaced_nodes, plan_mechanisms
from simulate.scenario import ScenarioError, parse_scenario


def _faults(body: str) -> list[object]:
    return list(parse_scenario(f'name = "t"\n[fleet]\nnodes = 4\nrounds = 10\n{body}').faults)


def test_a_namespace_takes_the_first_free_address_slot() -> None:
    assert free_slot(5, set()) == 5
    assert free_slot(5, {5, 6}) == 7
    assert free_slot(249, {249}) == 1  # wraps
    with pytest.raises(RuntimeError):
        free_slot(1, set(range(1, 250)))


def test_bandwidth_goes_through_the_proxy_unless_the_kernel_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(injector, "kernel_shaping_supported", lambda: "")
    faults = _faults('[[faults]]\nkind = "bandwidth"\nnode = 1\nbytes_per_second = 1e6\nat_round = 1\n'
                     '[[faults]]\nkind = "bandwidth"\nnode = 2\nbytes_per_second = 1e6\nat_round = 1\n'
                     'via = "kernel"\n')
    plans = plan_mechanisms(faults, broker_can_revoke=True)
    assert [p.mechanism for p in plans] == ["proxy", "netns-tbf"]
    assert namespaced_nodes(faults, plans) == {2}
    assert "in the kernel" in faults[1].describe() and "kernel" not in faults[0].describe()  # type: ignore[attr-defined]


def test_kernel_shaping_that_cannot_run_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(injector.os, "geteuid", lambda: 1000)
    faults = _faults('[[faults]]\nkind = "bandwidth"\nnode = 2\nbytes_per_second = 1e6\nat_round = 1\n'
                     'via = "kernel"\n')
    plans = plan_mechanisms(faults, broker_can_revoke=True)
    assert "needs root" in plans[0].skip
    assert namespaced_nodes(faults, plans) == set()  # a skipped fault makes no namespace


def test_a_bandwidth_fault_names_a_known_shaper() -> None:
    with pytest.raises(ScenarioError):
        _faults('[[faults]]\nkind = "bandwidth"\nnode = 2\nbytes_per_second = 1e6\nat_round = 1\nvia = "tc"\n')


def test_slots_are_reserved_by_one_fleet_at_a_time(tmp_path, monkeypatch) -> None:
    # Two fleets reading the host's addresses at once took the same slots.
    import threading

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(injector, "taken_slots", lambda: {7})
    entered = threading.Event()

    def second_fleet() -> None:
        with injector.slots_reserved() as taken:
            assert taken == {7}
            entered.set()

    with injector.slots_reserved() as taken:
        assert taken == {7}
        other = threading.Thread(target=second_fleet)
        other.start()
        assert not entered.wait(0.3), "a second fleet read the slots while the first held them"
    assert entered.wait(10)
    other.join()
