"""bench gloo: optional. Without torch it says so and exits 0; with torch it measures."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from simulate.bench import gloo


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    gloo.add_arguments(parser)
    return parser.parse_args(list(argv))


def _hide_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes `import torch` raise ImportError, as on a machine without it.
    for name in ("torch", "torch.distributed"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_torch_json_says_unavailable_and_exits_0(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _hide_torch(monkeypatch)
    assert gloo.torch_version() is None
    assert gloo.run(_args("--json")) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["benchmark"] == "gloo" and doc["available"] is False
    assert "torch is not installed" in captured.err


def test_without_torch_the_table_says_so(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _hide_torch(monkeypatch)
    assert gloo.run(_args()) == 0
    assert "not available" in capsys.readouterr().out


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert gloo.run(_args("--nodes", "1")) == 2
    assert gloo.run(_args("--iterations", "0")) == 2
    assert "--nodes" in capsys.readouterr().err


def test_measures_when_torch_is_installed_and_declines_when_not(capsys: pytest.CaptureFixture[str]) -> None:
    # CI has no torch: there the bench must decline cleanly; where torch is, 2 ranks measure.
    assert gloo.run(_args("--nodes", "2", "--iterations", "3", "--warmup", "1", "--values", "1000",
                          "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    if gloo.torch_version() is None:
        assert doc["available"] is False
    else:
        assert doc["available"] is True
        (result,) = doc["results"]
        assert result["nodes"] == 2 and result["ms"]["n"] == 3 and result["ms"]["median"] > 0
