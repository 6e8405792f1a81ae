"""`edgegrove model export`'s checks that need no TensorFlow: without TF it says how to get it
in one line and exits 2; a wrong output name is refused before TF is imported. (The export
itself, with TensorFlow, is tests/integration/test_model_export_fleet.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.commands.model_export import NO_TF
from edgegrove.cli import main


def test_without_tensorflow_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` raises ImportError
    out = tmp_path / "m.tflite"
    assert main(["model", "export", "examples/mnist_cnn/build.py:build_model", "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == NO_TF + "\n"
    assert NO_TF == "model export needs TensorFlow: pip install 'edgegrove[export]'"
    assert captured.out == "" and not out.exists()


def test_output_must_be_a_tflite_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["model", "export", "m.keras", "-o", str(tmp_path / "m.bin")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-o must name a .tflite file" in err


def test_output_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["model", "export", "m.keras"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--output" in err


@pytest.mark.parametrize(("source", "said"), [
    ("model.h5", "source 'model.h5': give a .keras file or path/to/file.py:function"),
    ("build.py", "source 'build.py': give a .keras file or path/to/file.py:function"),
    ("build.py:not-a-name", "source 'build.py:not-a-name': give a .keras file or path/to/file.py:function"),
    ("no/such/file.py:build", "no/such/file.py: no such file"),
    ("no/such/model.keras", "no/such/model.keras: no such file"),
])
def test_a_bad_source_is_refused_before_tensorflow_is_imported(
    source: str, said: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # the source's problem is said first
    assert main(["model", "export", source, "-o", str(tmp_path / "m.tflite")]) == 2
    assert capsys.readouterr().err == f"model export: {said}\n"
