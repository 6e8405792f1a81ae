"""Issue 4: an agent (numpy backend) fits a Raspberry Pi's memory budget, measured on a real
fleet by `edgegrove bench agent` (peak resident set, VmHWM, of every agent process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_agents_stay_under_the_pi_memory_budget() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edgegrove.cli", "bench", "agent", "--nodes", "3", "--rounds", "12", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert len(result["peak_rss_mb"]) == 3
    assert 20 < result["peak_rss_mb_max"] < result["pi_budget_mb"] == 150.0, result
    assert result["round_seconds_median"] > 0
