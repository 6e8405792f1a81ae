"""`edgegrove simulate --dataset FILE` with a file the agents cannot use (issue 54): checked
before anything starts, one line on stderr, exit code 2; before, the broker and every agent
started and the run ended with code 1 and ~7 lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.simulate_helpers import run_simulate

pytestmark = pytest.mark.integration

HEADER = "label," + ",".join(f"p{i}" for i in range(784))
ROW = ",".join(["7"] + ["128"] * 784)
CASES = {
    "not-a-number": (HEADER + "\n" + ROW + "\n" + ROW.replace("128", "x", 1) + "\n", (),
                     "holds 'x', not a number"),
    "wrong-width": ("label,a,b\n1,0.5,0.25\n", (), "takes (784,)"),
    "no-label-column": ("a,b\n1,2\n", (), "no label column 'label'"),
    "over-the-cap": (HEADER + "\n" + "\n".join([ROW] * 400) + "\n", ("--agent-option", "data_max_mb=1"),
                     "more than the configured data_max_mb"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_dataset_fails_in_one_line_before_anything_starts(case: str, tmp_path: Path) -> None:
    text, extra, message = CASES[case]
    path = tmp_path / f"{case}.csv"
    path.write_text(text)
    out = tmp_path / "run"
    done = run_simulate("--dataset", str(path), "--out", str(out), "--no-dashboard", *extra, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgegrove simulate: --dataset: "), done.stderr
    assert message in lines[0] and str(path) in lines[0]
    assert done.stdout == ""
    assert not out.exists(), "nothing (not even the run directory) may be created"
