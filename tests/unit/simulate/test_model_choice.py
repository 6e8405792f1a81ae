"""`edgegrove simulate --model/--backend/--numpy-model/--dataset/--partition` (simulate/
model_choice.py): what every agent is told to run, and the flags' checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.validate import UsageError
from simulate.model_choice import ModelChoice, add_arguments, choose


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {"py": tmp_path / "model.py", "tflite": tmp_path / "cnn.tflite", "npz": tmp_path / "data.npz"}
    for path in out.values():
        path.write_bytes(b"x")
    return out


def test_the_default_tells_the_agents_nothing_new() -> None:
    choice = choose(_args())
    assert choice == ModelChoice() and choice.is_thesis_setup
    assert [choice.agent_options(n) for n in range(3)] == [{}, {}, {}]


def test_a_python_model_on_a_shipped_dataset_with_a_partition(files: dict[str, Path]) -> None:
    choice = choose(_args("--model", f"{files['py']}:factory", "--dataset", "digits",
                          "--partition", "dirichlet:0.5"))
    assert not choice.is_thesis_setup
    assert choice.agent_options(4) == {"model": f"{files['py'].resolve()}:factory", "dataset": "digits",
                                       "partition": "dirichlet:0.5"}


def test_a_tflite_model_runs_on_litert_by_default_and_a_path_is_data(files: dict[str, Path]) -> None:
    choice = choose(_args("--model", str(files["tflite"]), "--dataset", str(files["npz"]),
                          "--partition", "shards:2"))
    assert choice.backend == "litert"
    assert choice.agent_options(0) == {"backend": "litert", "model": str(files["tflite"].resolve()),
                                       "data": str(files["npz"].resolve()), "partition": "shards:2"}


def test_mixed_alternates_numpy_and_litert_agents(files: dict[str, Path]) -> None:
    thesis = choose(_args("--backend", "mixed"))
    assert [thesis.agent_options(n) for n in range(3)] == [{}, {"backend": "litert"}, {}]
    cnn = choose(_args("--backend", "mixed", "--model", str(files["tflite"]),
                       "--numpy-model", f"{files['py']}:build"))
    assert cnn.agent_options(0) == {"model": f"{files['py'].resolve()}:build"}
    assert cnn.agent_options(1) == {"backend": "litert", "model": str(files["tflite"].resolve())}


def test_the_flags_win_over_the_scenarios_agent_options(files: dict[str, Path]) -> None:
    scenario = {"partition": "shards:3", "dataset": "digits", "backend": "litert"}
    assert choose(_args(), scenario) == ModelChoice("mlp", "litert", None, "digits", "shards:3")
    assert choose(_args("--partition", "iid", "--backend", "numpy"), scenario).agent_options(0) == {
        "dataset": "digits"}


@pytest.mark.parametrize(("argv", "says"), [
    (["--partition", "dirichlet:-1"], "--partition dirichlet:-1: unknown partition"),
    (["--partition", "shards:0"], "--partition shards:0"),
    (["--partition", "random"], "use iid, shards:K"),
    (["--dataset", "cifar"], "--dataset cifar: neither mnist nor digits"),
    (["--model", "{dir}/missing.py:factory"], "does not exist"),
    (["--model", "{dir}/missing.tflite"], "does not exist"),
    (["--model", "{py}"], "give mlp, path/to/file.py:factory"),
    (["--model", "{py}:not-a-name"], "give mlp"),
    (["--model", "some/where:factory"], "neither a .py file nor a module name"),
    (["--backend", "torch"], "--backend torch: use numpy, litert, mixed"),
    (["--backend", "litert", "--model", "{py}:factory"], "--backend litert runs the thesis MLP or a .tflite"),
    (["--backend", "numpy", "--model", "{tflite}"], "run it with --backend litert"),
    (["--backend", "mixed", "--model", "{tflite}"], "add --numpy-model"),
    (["--numpy-model", "{py}:factory"], "--numpy-model is for --backend mixed"),
    (["--backend", "mixed", "--model", "{tflite}", "--numpy-model", "{tflite}"], "not a .tflite"),
])
def test_a_bad_flag_is_one_line(argv: list[str], says: str, files: dict[str, Path]) -> None:
    filled = [a.format(dir=files["py"].parent, py=files["py"], tflite=files["tflite"]) for a in argv]
    with pytest.raises(UsageError) as caught:
        choose(_args(*filled))
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_model_that_cannot_load_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    from simulate.model_choice import check_models

    broken = tmp_path / "broken.py"
    broken.write_text("def factory():\n    raise ValueError('no weights here')\n")
    with pytest.raises(UsageError) as caught:
        check_models(choose(_args("--model", f"{broken}:factory")))
    assert "raised ValueError: no weights here" in str(caught.value) and "\n" not in str(caught.value)
    check_models(choose(_args()))  # the thesis MLP loads


def test_a_mixed_fleets_numpy_twin_must_be_the_tflites_model() -> None:
    from simulate.model_choice import check_models

    root = Path(__file__).resolve().parents[3]
    tflite, twin = root / "examples/mnist_cnn/mnist_cnn.tflite", root / "examples/mnist_cnn/model.py"
    digits = root / "examples/digits/model.py"
    check_models(choose(_args("--backend", "mixed", "--model", str(tflite), "--numpy-model", f"{twin}:factory")))
    with pytest.raises(UsageError) as caught:
        check_models(choose(_args("--backend", "mixed", "--model", str(tflite),
                                  "--numpy-model", f"{digits}:factory")))
    assert "would refuse the numpy agents" in str(caught.value)


def _digits_csv(path: Path, rows: int, cell: str = "3") -> Path:
    """A CSV for the thesis MLP (784 features); ``cell`` fills the last row's first feature."""
    row = ",".join(["7"] + ["128"] * 784)
    last = ",".join(["7", cell] + ["128"] * 783)
    path.write_text("label," + ",".join(f"p{i}" for i in range(784)) + "\n"
                    + "\n".join([row] * (rows - 1) + [last]) + "\n")
    return path


@pytest.mark.parametrize("cell, says", [
    ("x", "column 'p0' holds 'x', not a number"),
    ("3", None),
])
def test_a_dataset_file_is_read_before_anything_starts(tmp_path: Path, cell: str, says: str | None) -> None:
    from simulate.model_choice import check_dataset

    choice = ModelChoice(dataset=str(_digits_csv(tmp_path / "d.csv", 50, cell)))
    if says is None:
        check_dataset(choice, {}, 7)
        return
    with pytest.raises(UsageError, match=says) as refused:
        check_dataset(choice, {}, 7)
    assert str(refused.value).startswith("--dataset: ") and "\n" not in str(refused.value)


def test_a_dataset_file_too_large_is_refused_unread(tmp_path: Path) -> None:
    from simulate.model_choice import check_dataset

    choice = ModelChoice(dataset=str(_digits_csv(tmp_path / "d.csv", 400, "x")))  # bad, unread
    with pytest.raises(UsageError, match="more than the configured data_max_mb"):
        check_dataset(choice, {"data_max_mb": 0.5}, 7)
    check_dataset(ModelChoice(), {"data_max_mb": 0.5}, 7)  # a packaged dataset: nothing to weigh
