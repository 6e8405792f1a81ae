"""load_model: the specs it takes and a one-line ModelError for everything a user gets wrong."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from agent.model.contract import ModelError
from agent.model.loader import check_model, load_model
from agent.model.mlp_model import MlpModel

GOOD = textwrap.dedent('''
    import numpy as np
    from agent.model.contract import TensorSpec

    class Linear:
        name = "linear"
        input_shape = (4,)
        num_classes = 3
        tensors = (TensorSpec("w", (4, 3)), TensorSpec("b", (3,)))
        param_count = 15
        def initial_params(self, seed):
            return np.random.default_rng(seed).normal(size=15).astype(np.float32)
        def predict(self, params, x):
            return x.reshape(len(x), 4) @ params[:12].reshape(4, 3) + params[12:]
        def loss_and_grad(self, params, x, y):
            return 0.5, np.zeros(15, dtype=np.float32)

    def factory():
        return Linear()
''')


def write(tmp_path: Path, body: str, name: str = "user_model.py") -> Path:
    path = tmp_path / name
    path.write_text(GOOD + textwrap.dedent(body))
    return path


def error_of(spec: str) -> str:
    with pytest.raises(ModelError) as info:
        load_model(spec)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_mlp_is_the_thesis_model() -> None:
    model = load_model("mlp")
    assert isinstance(model, MlpModel) and model.param_count == 407050


def test_file_factory_loads_and_keeps_the_contract(tmp_path: Path) -> None:
    model = load_model(f"{write(tmp_path, '')}:factory")
    assert model.name == "linear" and model.param_count == 15


def test_module_factory_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "", name="my_linear_model.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_model("my_linear_model:factory").name == "linear"
    assert load_model("examples.digits.model:factory").name == "digits-mlp"


def test_a_factory_that_raises_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, '''
        def broken():
            raise ValueError("no weights file\\nsecond line")
    ''')
    message = error_of(f"{path}:broken")
    assert message == f"factory {path}:broken raised ValueError: no weights file; second line"


@pytest.mark.parametrize(("spec", "expected"), [
    ("nonsense", "use mlp, pkg.module:factory"),
    ("missing_file.py:factory", "does not exist"),
    ("no_such_module_xyz:factory", "is not installed"),
    ("missing.tflite", "no such file"),
])
def test_bad_specs(spec: str, expected: str) -> None:
    assert expected in error_of(spec)


@pytest.mark.parametrize(("body", "call", "expected"), [
    ("", "nothing_here", "has no 'nothing_here'"),
    ("x = 3\n", "x", "is not callable"),
    ("def f():\n    return object()\n", "f", "has no name, input_shape"),
    ("class W(Linear):\n    param_count = 16\ndef f():\n    return W()\n", "f", "param_count is 16 but its tensors hold 15"),
    ("class W(Linear):\n    input_shape = [4]\ndef f():\n    return W()\n", "f", "input_shape must be a tuple"),
    ("class W(Linear):\n    num_classes = 1\ndef f():\n    return W()\n", "f", "num_classes must be an int >= 2"),
    ("class W(Linear):\n    def initial_params(self, seed):\n        return np.zeros(15)\ndef f():\n    return W()\n",
     "f", "initial_params(0) is float64, expected float32"),
    ("class W(Linear):\n    def initial_params(self, seed):\n        return np.zeros(14, np.float32)\ndef f():\n    return W()\n",
     "f", "initial_params(0) has shape (14,)"),
    ("class W(Linear):\n    def initial_params(self, seed):\n        return np.random.default_rng().random(15, np.float32)\n"
     "def f():\n    return W()\n", "f", "differs between two calls"),
    ("class W(Linear):\n    def loss_and_grad(self, p, x, y):\n        return float('nan'), np.zeros(15, np.float32)\n"
     "def f():\n    return W()\n", "f", "non-finite loss"),
    ("class W(Linear):\n    def loss_and_grad(self, p, x, y):\n        return 1.0, np.zeros(7, np.float32)\n"
     "def f():\n    return W()\n", "f", "gradient has shape (7,)"),
    ("class W(Linear):\n    def predict(self, p, x):\n        return np.zeros((len(x), 2))\ndef f():\n    return W()\n",
     "f", "predict on 2 samples gave (2, 2), expected (2, 3)"),
    ("class W(Linear):\n    def predict(self, p, x):\n        raise KeyError('w')\ndef f():\n    return W()\n",
     "f", "predict raised KeyError"),
])
def test_contract_violations_are_named(tmp_path: Path, body: str, call: str, expected: str) -> None:
    path = write(tmp_path, body)
    assert expected in error_of(f"{path}:{call}")


def test_an_import_error_in_the_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad_import.py"
    path.write_text("import does_not_exist_anywhere\n")
    assert "importing" in error_of(f"{path}:factory") and "ModuleNotFoundError" in error_of(f"{path}:factory")


def test_check_model_accepts_the_example_and_returns_it() -> None:
    from examples.digits.model import DigitsMLP

    model = DigitsMLP()
    assert check_model(model, "x") is model
    assert np.array_equal(model.initial_params(5), model.initial_params(5))


def test_a_model_file_imports_its_siblings(tmp_path: Path) -> None:
    (tmp_path / "sibling_layers_xyz.py").write_text("HIDDEN = 15\n")
    path = tmp_path / "uses_sibling.py"
    path.write_text(GOOD.replace("param_count = 15", "from sibling_layers_xyz import HIDDEN as param_count"))
    assert load_model(f"{path}:factory").param_count == 15
