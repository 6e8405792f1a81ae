"""`edgegrove simulate` with a bad scenario file: a clear error, exit code 2, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.simulate_helpers import run_simulate

pytestmark = pytest.mark.integration

CASES = {
    "unknown-fault": ('[[faults]]\nkind = "meteor"\nnode = 1\nat_round = 2\n', "unknown fault kind 'meteor'"),
    "node-out-of-range": ('[[faults]]\nkind = "crash"\nnode = 12\nat_round = 2\n', "node id 12 is out of range"),
    "malformed-toml": ('[[faults]\nkind = "crash"\n', "is not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_scenario_fails_before_anything_starts(case: str, tmp_path: Path) -> None:
    text, message = CASES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    out = tmp_path / "run"
    done = run_simulate("--scenario", str(path), "--out", str(out), timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and str(path) in done.stderr
    assert done.stdout == ""
    assert not out.exists(), "nothing (not even the run directory) may be created"
