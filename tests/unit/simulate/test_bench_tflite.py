"""bench tflite on the committed examples/mnist_cnn/mnist_cnn.tflite: the measured step's
figures, and the bench's run with its processes replaced by the step run in this process (the
native one and the aarch64 one alike: no qemu, no child process). No figure is asserted."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from simulate.bench import tflite, tflite_step

TFLITE = Path(__file__).resolve().parents[3] / "examples" / "mnist_cnn" / "mnist_cnn.tflite"
SMALL = ("--batch", "3", "--steps", "2", "--warmup", "1")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tflite.add_arguments(parser)
    return parser.parse_args(list(argv))


def _step_here(command: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m simulate.bench.tflite_step ARGS`` run in this process."""
    assert command[:2] == ["-m", tflite.STEP_MODULE], command
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = tflite_step.main(command[2:])
    return subprocess.CompletedProcess(command, code, out.getvalue(), "")


def test_the_step_measures_loss_and_grad_on_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert tflite_step.main([str(TFLITE), "--batch", "3", "--steps", "2", "--warmup", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "mnist-cnn" and result["parameters"] == 225_034
    assert result["file_bytes"] == TFLITE.stat().st_size
    assert result["batch_norm_train"] is False
    assert (result["batch"], result["steps"], result["warmup"]) == (3, 2, 1)
    assert 0 < result["rss_before_model_mb"] <= result["peak_rss_mb"]
    assert 0 <= result["seconds_per_batch_min"] <= result["seconds_per_batch_median"] \
        <= result["seconds_per_batch_max"]


def test_native_and_aarch64_rows_in_one_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, Any]] = []
    real_run = subprocess.run

    def native(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if command[1:3] != ["-m", tflite.STEP_MODULE]:  # not the step (the machine's facts)
            return real_run(command, **kwargs)
        calls.append(("native", kwargs["env"]["PYTHONPATH"]))
        return _step_here(command[1:])

    def arm64_env(*args: str, timeout: float, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[str]:
        assert args[:2] == ("python", str(tmp_path / "site"))
        calls.append(("aarch64", env))
        return _step_here(list(args[2:]))

    monkeypatch.setattr(tflite.subprocess, "run", native)
    monkeypatch.setattr(tflite, "arm64_env", arm64_env)
    monkeypatch.setattr(tflite, "pi_cpu_userland", lambda dest: {"QEMU_CPU": "cortex-a72"})
    out = tmp_path / "doc.json"
    args = _args("--model", str(TFLITE), *SMALL, "--aarch64", "--arm64-site", str(tmp_path / "site"),
                 "--out", str(out))
    assert tflite.run(args) == 0
    table = capsys.readouterr().out
    assert [where for where, _ in calls] == ["native", "aarch64"]
    assert calls[0][1].split(":")[0] == str(tflite.REPO_ROOT)  # the child imports this tree
    assert calls[1][1] == {"QEMU_CPU": "cortex-a72"}
    assert table.count("mnist_cnn.tflite") == 2 and "emulation time" in table
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "tflite" and doc["qemu_cpu"] == "cortex-a72"
    assert [r["where"] for r in doc["results"]] == ["native", "aarch64"]


def test_a_failed_process_is_a_row_with_its_error_and_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real_run = subprocess.run

    def crashed(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if command[1:3] != ["-m", tflite.STEP_MODULE]:
            return real_run(command, **kwargs)
        return subprocess.CompletedProcess(command, -11, "", "Fatal Python error: Segmentation fault\n")

    monkeypatch.setattr(tflite.subprocess, "run", crashed)
    assert tflite.run(_args("--model", str(TFLITE), *SMALL, "--json")) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"] == [{"file": str(TFLITE), "where": "native",
                               "error": "exit -11: Fatal Python error: Segmentation fault"}]
    assert "error: exit -11" in tflite.table(doc["results"])


@pytest.mark.parametrize("argv", [("--model", "missing.tflite"), ("--model", str(TFLITE), "--steps", "0"),
                                  ("--model", str(TFLITE), "--batch", "0"), ()])
def test_bad_arguments_stop_before_anything_runs(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit) as stopped:
        _args(*argv)
    assert stopped.value.code == 2
