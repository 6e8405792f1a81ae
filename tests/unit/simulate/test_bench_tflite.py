"""bench tflite on the committed examples/mnist_cnn/mnist_cnn.tflite and on the PyTorch
example's Python-path spec (examples/torch_cnn/model.py:factory): the measured step's figures,
and the bench's run with its processes replaced by the step run in this process (the native one
and the aarch64 one alike: no qemu, no child process, no install). No figure is asserted."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from simulate.bench import tflite, tflite_step

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TFLITE = EXAMPLES / "mnist_cnn" / "mnist_cnn.tflite"
TORCH = f"{EXAMPLES / 'torch_cnn' / 'model.py'}:factory"  # needs torch (the dev extra has it)
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
    assert (result["runtime"], result["runtime_version"]) == ("litert", result["litert"])
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
    monkeypatch.setattr(tflite, "pi_cpu_userland", lambda dest, core: {"QEMU_CPU": core})
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


def test_the_step_loads_a_python_spec_as_an_agent_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert tflite_step.main([TORCH, *SMALL]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "digits-torch-cnn" and result["parameters"] == 6_090
    assert result["file"] == TORCH and result["file_bytes"] is None
    assert result["runtime"] == "torch" and result["runtime_version"] == sys.modules["torch"].__version__
    assert result["batch_norm_train"] is False
    assert 0 < result["rss_before_model_mb"] <= result["peak_rss_mb"]


def test_a_python_spec_without_torch_runs_on_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "numpy_model.py"
    model.write_text("def factory():\n    from agent.model.mlp_model import MlpModel\n"
                     "    return MlpModel()\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in the child: nothing imported it
    assert tflite_step.main([f"{model}:factory", *SMALL]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["runtime"], result["runtime_version"]) == ("python", None)


def test_a_torch_model_natively_and_on_aarch64_with_torch_installed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    installed: list[tuple[Path, dict[str, Any]]] = []
    real_run = subprocess.run

    def native(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if command[1:3] != ["-m", tflite.STEP_MODULE]:
            return real_run(command, **kwargs)
        return _step_here(command[1:])

    def install_site(site: Path, **kwargs: Any) -> Any:
        installed.append((site, kwargs))
        return argparse.Namespace(path=site)

    def arm64_env(*args: str, timeout: float, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[str]:
        assert args[0] == "python" and args[1] == str(installed[0][0])
        return _step_here(list(args[2:]))

    monkeypatch.setattr(tflite.subprocess, "run", native)
    monkeypatch.setattr(tflite, "install_site", install_site)
    monkeypatch.setattr(tflite, "arm64_env", arm64_env)
    monkeypatch.setattr(tflite, "pi_cpu_userland", lambda dest, core: {"QEMU_CPU": core})
    spec = "examples/torch_cnn/model.py:factory"
    monkeypatch.chdir(EXAMPLES.parent)  # a relative spec, as typed in the checkout
    assert tflite.run(_args("--model", spec, *SMALL, "--aarch64", "--qemu-cpu", "cortex-a72",
                            "--out", str(tmp_path / "doc.json"))) == 0
    assert [kwargs for _, kwargs in installed] == [{"data": False, "torch": True}]
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("torch_cnn/model.py:factory")]
    assert len(rows) == 2 and all(" torch " in row and " - " in row for row in rows)
    assert "(qemu cortex-a72)" in rows[1]


def test_one_row_per_emulated_core_each_on_its_pi_s_userland(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    userlands: list[tuple[Path, str]] = []
    envs: list[dict[str, str] | None] = []

    def pi_cpu_userland(dest: Path, core: str) -> dict[str, str]:
        userlands.append((dest, core))
        return {"QEMU_CPU": core}

    def arm64_env(*args: str, timeout: float, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[str]:
        envs.append(env)
        if env == {"QEMU_CPU": "cortex-a72"}:  # as torch's aarch64 wheel does on a Pi 4's core
            return subprocess.CompletedProcess(list(args), 132, "", "Illegal instruction\n")
        return _step_here(list(args[2:]))

    real_run = subprocess.run

    def native(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if command[1:3] != ["-m", tflite.STEP_MODULE]:
            return real_run(command, **kwargs)
        return _step_here(command[1:])

    monkeypatch.setattr(tflite.subprocess, "run", native)
    monkeypatch.setattr(tflite, "arm64_env", arm64_env)
    monkeypatch.setattr(tflite, "pi_cpu_userland", pi_cpu_userland)
    out = tmp_path / "doc.json"
    args = _args("--model", str(TFLITE), *SMALL, "--aarch64", "--arm64-site", str(tmp_path / "site"),
                 "--qemu-cpu", "cortex-a72", "cortex-a76", "--out", str(out))
    assert tflite.run(args) == 1  # a row failed
    assert [core for _, core in userlands] == ["cortex-a72", "cortex-a76"]
    assert len({dest for dest, _ in userlands}) == 2  # a userland (cpuinfo) of its own each
    assert envs == [{"QEMU_CPU": "cortex-a72"}, {"QEMU_CPU": "cortex-a76"}]
    table = capsys.readouterr().out
    assert "mnist_cnn.tflite on aarch64 (qemu cortex-a72): error: exit 132: Illegal instruction" in table
    assert "(qemu cortex-a76)" in table
    doc = json.loads(out.read_text())
    assert doc["qemu_cpu"] == "cortex-a72 cortex-a76"
    assert [r.get("qemu_cpu") for r in doc["results"]] == [None, "cortex-a72", "cortex-a76"]


def test_only_a_python_spec_installs_torch_for_aarch64(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: list[dict[str, Any]] = []

    def install_site(site: Path, **kwargs: Any) -> Any:
        installed.append(kwargs)
        raise tflite.Arm64Error("no qemu here")

    monkeypatch.setattr(tflite, "install_site", install_site)
    assert tflite.run(_args("--model", str(TFLITE), "--aarch64")) == 1
    assert installed == [{"data": False, "torch": False}]


def test_a_spec_is_made_absolute_and_named_by_its_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES)
    assert tflite.model_spec("torch_cnn/model.py:factory") == TORCH
    assert tflite.model_spec("mnist_cnn/mnist_cnn.tflite") == str(TFLITE)
    assert tflite.label(TORCH) == "torch_cnn/model.py:factory"
    assert tflite.label(str(TFLITE)) == "mnist_cnn.tflite"
    assert tflite.step_arguments(TORCH, _args("--model", TORCH))[2] == TORCH


def test_a_document_written_before_python_specs_still_makes_a_table() -> None:
    old = {"file": str(TFLITE), "where": "native", "machine": "x86_64", "file_bytes": 940_000,
           "batch_norm_train": False, "litert": "2.3.0", "peak_rss_mb": 70.0,
           "rss_before_model_mb": 30.0, "seconds_per_batch_median": 0.02,
           "seconds_per_batch_min": 0.01, "seconds_per_batch_max": 0.03, "load_seconds": 0.3}
    assert "litert 2.3.0" in tflite.table([old])


def test_an_unknown_core_stops_before_anything_runs() -> None:
    with pytest.raises(SystemExit) as stopped:
        _args("--model", str(TFLITE), "--aarch64", "--qemu-cpu", "cortex-a53")
    assert stopped.value.code == 2


@pytest.mark.parametrize("spec", ["examples/torch_cnn/model.py", "missing.py:factory",
                                  "examples/torch_cnn/model.py:not-a-name", "mlp"])
def test_a_bad_model_spec_stops_before_anything_runs(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parent)
    with pytest.raises(SystemExit) as stopped:
        _args("--model", spec)
    assert stopped.value.code == 2
