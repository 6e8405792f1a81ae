"""Shared bench helpers: tables, the JSON document, --out, machine facts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from simulate.bench import common


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    common.add_output_arguments(parser)
    return parser.parse_args(list(argv))


def test_format_table_aligns_columns() -> None:
    text = common.format_table(["name", "value"], [["a", 1.23456], ["longer", None]])
    lines = text.splitlines()
    assert lines[0].startswith("name  ") and lines[0].endswith("value")
    assert lines[2].endswith("1.23") and lines[3].endswith("-")
    assert len({len(line) for line in lines}) == 1


def test_markdown_table_has_header_alignment_and_rows() -> None:
    text = common.markdown_table(["a", "b"], [[1, 2.5], ["x", 1234.5]])
    assert text.splitlines() == ["| a | b |", "| --- | ---: |", "| 1 | 2.5 |", "| x | 1234 |"]


def test_summary_gives_median_and_spread() -> None:
    s = common.summary([3.0, 1.0, 2.0, 10.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 10.0 and s["n"] == 4
    assert s["p10"] <= s["median"] <= s["p90"]
    with pytest.raises(ValueError, match="no measurements"):
        common.summary([])


def test_document_records_the_machine() -> None:
    doc = common.document("demo", results=[1])
    assert doc["benchmark"] == "demo" and doc["results"] == [1]
    machine = doc["machine"]
    assert set(machine) >= {"cpu_model", "cpu_count", "python", "mosquitto", "date"}
    assert machine["cpu_model"] and machine["python"].count(".") == 2


def test_emit_prints_one_json_document_and_writes_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deep" / "demo.json"
    common.emit({"benchmark": "demo", "x": 1}, _args("--json", "--out", str(out)), "TABLE")
    printed = capsys.readouterr().out
    assert json.loads(printed) == {"benchmark": "demo", "x": 1}
    assert json.loads(out.read_text()) == {"benchmark": "demo", "x": 1}


def test_emit_prints_the_table_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    common.emit({"x": 1}, _args(), "TABLE")
    assert capsys.readouterr().out == "TABLE\n"
