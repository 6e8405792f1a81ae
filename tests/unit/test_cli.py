"""The dispatcher and the device's commands (topology, analyze isolation), in-process, through
the device's own table: no top-level CLI, no simulator, no dashboard."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.cli import COMMANDS, Command, dispatch


def main(argv: Sequence[str]) -> int:
    return dispatch("edgegrove", "the device's commands", COMMANDS, argv)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- dispatcher


def test_no_command_prints_the_overview_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys)
    assert code == 2
    for name in COMMANDS:
        assert name in out


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    assert "topology" in out and "analyze" in out and "--help" in out


def test_unknown_command_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "frobnicate")
    assert code == 2
    assert "unknown command 'frobnicate'" in err


def test_a_command_whose_module_is_missing_says_what_to_install(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = {"ghost": Command("agent.commands.no_such_module_here", "nothing")}
    code = dispatch("edgegrove", "test", table, ["ghost"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no_such_module_here" in err and "pip install" in err


def test_the_device_table_names_only_device_modules() -> None:
    assert {"agent", "topology", "train-local", "analyze"} <= set(COMMANDS)
    assert all(c.module.startswith("agent.") for c in COMMANDS.values())


def test_analyze_lists_its_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "analyze", "--help")
    assert code == 0
    assert "isolation" in out and "fault-cost" not in out  # fault cost runs the simulator
    code, _, err = run_cli(capsys, "analyze", "nonsense")
    assert code == 2 and "unknown command" in err


@pytest.mark.parametrize("argv", [["topology", "--help"], ["analyze", "isolation", "--help"]])
def test_command_help_explains_options(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "--arity" in out


# ---------------------------------------------------------------- topology


def test_topology_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "topology", "--nodes", "7")
    assert code == 0
    assert out.splitlines()[0] == "0"
    assert "3   (backup -> 4)" in out
    assert "height 2" in out
    assert "6 tree + 3 backup = 9" in out


def test_topology_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "topology", "--nodes", "6", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["members"] == [0, 1, 2, 3, 4, 5] and doc["height"] == 2 and doc["root"] == 0
    five = doc["nodes"]["5"]  # the only child of 2: its backup is its uncle 1
    assert five["parent"] == 2 and five["children"] == [] and five["backup"] == 1
    assert five["escalation"] == [2, 1, 0]
    assert doc["nodes"]["0"]["parent"] is None and doc["nodes"]["0"]["backup"] is None
    assert doc["nodes"]["0"]["escalation"] == []
    assert [1, 5] in doc["links"] and [0, 1] in doc["links"]
    assert doc["link_counts"] == {"tree": 5, "backup": 3, "total": 8}
    assert len(doc["links"]) == 8


def test_topology_with_explicit_members_and_arity(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "topology", "--members", "9", "3", "5", "12", "--arity", "3",
                           "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["root"] == 3 and doc["arity"] == 3
    assert doc["nodes"]["3"]["children"] == [5, 9, 12]
    assert doc["nodes"]["9"]["backups"] == [12, 5]


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes", "0"], "--nodes"),
    (["--nodes", "5000"], "--nodes"),
    (["--nodes", "7", "--arity", "1"], "--arity"),
    (["--members", "1", "2048"], "--members"),
])
def test_topology_bad_options_give_a_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, "topology", *argv)
    assert code == 2 and out == ""
    assert message in err


def test_topology_needs_nodes_or_members(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["topology"])
    assert done.value.code == 2
    assert "--nodes" in capsys.readouterr().err


# ---------------------------------------------------------------- analyze isolation


def test_isolation_json_is_one_deterministic_document(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["analyze", "isolation", "--heights", "2", "3", "4", "--trials", "400", "--seed", "3",
            "--json"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0
    doc = json.loads(out)  # exactly one document: json.loads refuses anything extra
    assert "height 2" in err  # progress goes to stderr
    assert [r["height"] for r in doc["results"]] == [2, 3, 4]
    assert [r["nodes"] for r in doc["results"]] == [7, 15, 31]
    assert all(0 < r["mean_fraction"] < 1 for r in doc["results"])
    assert doc["results"][0]["exact_mean_failed"] == pytest.approx(3.849, abs=1e-3)
    assert doc["results"][2]["exact_mean_failed"] is None
    assert doc["thesis"]["figure_values"] is None
    assert all(doc["thesis"]["claims_hold"].values())
    assert run_cli(capsys, *argv)[1] == out  # same seed, same document


def test_isolation_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "analyze", "isolation", "--heights", "2", "3", "--trials", "300")
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [(row[0], row[1], row[2]) for row in rows] == [("2", "7", "9"), ("3", "15", "21")]
    assert "[agrees]" in out and "DIFFERS" not in out


def test_isolation_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "figs" / "figure11.png"
    code, _, err = run_cli(capsys, "analyze", "isolation", "--heights", "2", "3", "--trials", "200",
                           "--plot", str(path), "--json")
    assert code == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(path) in err


def test_isolation_plot_to_an_impossible_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(SystemExit) as done:  # refused while parsing, before any work
        main(["analyze", "isolation", "--heights", "2", "--trials", "50",
              "--plot", str(blocker / "fig.png")])
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == ""
    assert "--plot" in err and "cannot be created" in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--heights", "0"], "--heights"),
    (["--trials", "0"], "--trials"),
    (["--arity", "1"], "--arity"),
    (["--heights", "14", "--trials", "100000"], "too much work"),
])
def test_isolation_bad_options_give_a_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, "analyze", "isolation", *argv)
    assert code == 2 and out == ""
    assert message in err
