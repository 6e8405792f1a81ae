"""bench isolation: Figure 11 from the protocol core, as table, JSON and plot."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from agent.protocol.isolation import isolation_table
from simulate.bench import isolation


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    isolation.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_json_is_the_protocol_cores_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert isolation.run(_args("--heights", "2", "1", "--trials", "300", "--seed", "4", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = isolation_table([1, 2], 2, 300, np.random.default_rng(4))
    assert doc["benchmark"] == "isolation" and "machine" in doc
    assert doc["results"] == [r.as_dict() for r in expected]
    assert doc["results"][1]["nodes"] == 7 and doc["results"][1]["exact_mean_failed"] == pytest.approx(3.849, abs=1e-3)
    assert doc["thesis"]["claims_hold"]["two_root_links_can_halt"] is True


def test_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "fig11.png"
    assert isolation.run(_args("--heights", "1", "2", "3", "--trials", "200", "--plot", str(png))) == 0
    out = capsys.readouterr().out
    assert "failed links (mean ± std)" in out and "[agrees]" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_round_trip_through_json(capsys: pytest.CaptureFixture[str]) -> None:
    isolation.run(_args("--heights", "2", "--trials", "50", "--json"))
    doc = json.loads(capsys.readouterr().out)
    assert isolation.results_from(doc)[0].as_dict() == doc["results"][0]


@pytest.mark.parametrize("argv", [["--heights", "0"], ["--arity", "1"], ["--trials", "0"],
                                  ["--heights", "15"]])
def test_bad_options_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert isolation.run(_args(*argv)) == 2
    assert "bench isolation" in capsys.readouterr().err
