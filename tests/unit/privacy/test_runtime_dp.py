"""The runtime with differential privacy: epsilon in each round's telemetry, the run stopped
where the budget is spent (one agent on the in-memory bus, tests/unit/test_runtime.py's rig)."""

from __future__ import annotations

import logging

import pytest

from agent.privacy.accountant import Accountant
from agent.protocol.messages import Telemetry
from agent.transport.memory import MemoryBus
from tests.unit.test_runtime import TOPICS, runtime


def _run(**options: object) -> list[Telemetry]:
    bus = MemoryBus(will_delay=1.0)
    agent = runtime(bus, 0, fleet_size=1, telemetry=True, dp_clip=1.0, **options)
    reports: list[Telemetry] = []
    bus.connect("collector", lambda topic, payload, size: reports.append(Telemetry.decode(payload)),
                [TOPICS.telemetry(0)])
    assert agent.run() == 0
    return reports


def test_each_rounds_telemetry_carries_the_epsilon_spent_so_far() -> None:
    reports = _run(rounds=3, dp_noise=10.0, dp_epsilon=3.0)
    # A plain iterator of batches: sampled at rate 1 (every step sees the whole "data").
    spent = Accountant(10.0, 1.0, 1e-5)
    assert [t.round for t in reports] == [0, 1, 2]
    assert [t.dp_epsilon for t in reports] == [spent.epsilon(n) for n in (1, 2, 3)]
    assert 0 < reports[0].dp_epsilon < reports[-1].dp_epsilon <= 3.0  # type: ignore[operator]


def test_the_run_stops_where_the_budget_is_spent() -> None:
    cap = Accountant(10.0, 1.0, 1e-5).max_steps(1.0)
    assert 1 <= cap < 50
    reports = _run(rounds=1000, dp_noise=10.0, dp_epsilon=1.0)
    assert len(reports) == cap and (reports[-1].dp_epsilon or 0) <= 1.0


def test_warn_at_the_budget_runs_on_and_logs_each_round_past_it(caplog: pytest.LogCaptureFixture) -> None:
    cap = Accountant(10.0, 1.0, 1e-5).max_steps(1.0)
    with caplog.at_level(logging.WARNING, logger="edgegrove.agent"):
        reports = _run(rounds=cap + 2, dp_noise=10.0, dp_epsilon=1.0, dp_at_budget="warn")
    assert len(reports) == cap + 2 and (reports[-1].dp_epsilon or 0) > 1.0
    assert sum("over the budget 1" in r.getMessage() for r in caplog.records) == 2
