"""`edgegrove model check`: what it prints for a good model, exit 2 and one line for a bad one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from agent.model.contract import fingerprint
from edgegrove.cli import main
from examples.digits.model import DigitsMLP

DIGITS = "examples/digits/model.py:factory"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["model", "check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_a_good_model_with_data(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, DIGITS, "--dataset", "digits", "--seed", "3")
    assert code == 0, err
    assert "parameters   9,610 in 4 tensors" in out
    assert "input        (64,)" in out and "labels       int in [0, 10)" in out
    assert "898 training samples" in out and "finite" in out and "NOT FINITE" not in out
    assert f"fingerprint  {fingerprint(DigitsMLP(), 3)}" in out


def test_check_the_thesis_mlp_without_data(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mlp")
    assert code == 0 and "407,050" in out and "random samples" in out


def test_the_model_command_lists_check_and_export(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "--help"]) == 0
    out = capsys.readouterr().out
    assert "check" in out and "export" in out


def nan_model(tmp_path: Path) -> str:
    path = tmp_path / "nan_model.py"
    path.write_text(textwrap.dedent('''
        import numpy as np
        from examples.digits.model import DigitsMLP

        class NanOnData(DigitsMLP):
            def loss_and_grad(self, params, x, y):
                loss, grad = super().loss_and_grad(params, x, y)
                return (float("nan") if x.max() > 0.5 else loss), grad

        def factory():
            return NanOnData()
    '''))
    return f"{path}:factory"


@pytest.mark.parametrize(("argv", "expected"), [
    (["examples/digits/model.py:missing"], "has no 'missing'"),
    (["nonsense"], "use mlp, pkg.module:factory"),
    (["mlp", "--dataset", "digits"], "samples have shape (64,) (64 values) but model mlp takes (784,)"),
    ([DIGITS, "--batch", "0"], "--batch must be at least 1"),
    ([DIGITS, "--holdout", "1.5"], "--holdout must be in [0, 1)"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and expected in err and err.count("\n") == 1, err


def test_missing_data_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["model", "check", DIGITS, "--data", "no-such.npz"])
    assert info.value.code == 2 and "no-such.npz does not exist" in capsys.readouterr().err


def test_labels_out_of_range_and_nan_gradient(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((5, 64), np.float32), y=np.array([0, 1, 2, 3, 12]))
    code, _, err = run(capsys, DIGITS, "--data", str(tmp_path / "d.npz"))
    assert code == 2 and "labels span 0..12 but model digits-mlp has 10 classes" in err
    code, out, err = run(capsys, nan_model(tmp_path), "--dataset", "digits")
    assert code == 2 and "NOT FINITE" in out and "non-finite loss or gradient" in err
