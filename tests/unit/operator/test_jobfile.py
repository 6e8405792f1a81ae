"""Job files: what a valid one becomes, and one line for each kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.operator.jobfile import JobFileError, read_job_file

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_a_full_job_file_is_read_with_its_tables(tmp_path: Path) -> None:
    job = read_job_file(write(tmp_path, """
name = "barn-mlp"
data = "mnist"
partition = "dirichlet:0.5"
min_devices = 3
sync_every = 4
[stop]
rounds = 50
target_accuracy = 0.97
deadline_after = 600
[devices]
labels = {site = "barn"}
[options]
eval_every = 5
"""))
    assert (job.name, job.model, job.backend_to_run, job.partition) == ("barn-mlp", "mlp", "numpy", "dirichlet:0.5")
    assert job.devices.selector().labels == {"site": "barn"}
    rule = job.stop.rule(now=1000.0)
    assert (rule.rounds, rule.target_accuracy, rule.deadline) == (50, 0.97, 1600.0)
    assert job.options == {"eval_every": 5}


def test_a_model_file_is_resolved_against_the_job_file_and_a_tflite_runs_on_litert(tmp_path: Path) -> None:
    (tmp_path / "cnn.tflite").write_bytes(b"x")
    job = read_job_file(write(tmp_path, 'name = "j"\ndata = "d"\nmodel = "cnn.tflite"\n'))
    assert job.model == str(tmp_path / "cnn.tflite")
    assert job.backend_to_run == "litert"


def test_a_python_model_keeps_its_factory(tmp_path: Path) -> None:
    model = REPO / "examples" / "digits" / "model.py"
    job = read_job_file(write(tmp_path, f'name = "j"\ndata = "digits"\nmodel = "{model}:factory"\n'))
    assert job.model == f"{model}:factory"


@pytest.mark.parametrize(("text", "says"), [
    ('data = "d"', "name"),
    ('name = "jobs"\ndata = "d"', "reserved"),
    ('name = "j"\ndata = "d"\nbatch = 0', "batch"),
    ('name = "j"\ndata = "d"\nlr = "fast"', "lr"),
    ('name = "j"\ndata = "a/b"', "data source name"),  # as the signed document checks it
    ('name = "j"\ndata = "d"\nsync_every = 0', "sync_every"),
    ('name = "j"\ndata = "d"\npartition = "dirichlet:x"', "partition"),
    ('name = "j"\ndata = "d"\ncolour = 1', "colour"),
    ('name = "j"\ndata = "d"\nmodel = "nowhere.tflite"', "does not exist"),
    ('name = "j"\ndata = "d"\nmodel = "m.py"', "factory"),
    ('name = "j"\ndata = "d"\n[devices]\nall = true\nids = ["a"]', "one of all"),
    ('name = "j"\ndata = "d"\n[devices]\nids = ["Not_A_Device"]', "device name"),
    ('name = "j"\ndata = "d"\n[options]\nbroker = "mqtt://x"', "may not be set"),
    ('name = "j"\ndata = "d"\nlr_schedule = "linear"', "rounds"),
    ('name = "j"\ndata = "d"\n[stop]\ndeadline = 2020-01-01T00:00:00Z\ndeadline_after = 5', "not both"),
    ('name = "j"\ndata = ', "TOML"),
])
def test_each_mistake_is_one_line_naming_it(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(JobFileError) as caught:
        read_job_file(write(tmp_path, text))
    message = str(caught.value)
    assert says in message
    assert "\n" not in message


def test_a_deadline_in_the_past_is_refused(tmp_path: Path) -> None:
    job = read_job_file(write(tmp_path, 'name = "j"\ndata = "d"\n[stop]\ndeadline = 2020-01-01T00:00:00Z\n'))
    with pytest.raises(JobFileError, match="has passed"):
        job.stop.rule(now=1.8e9)


@pytest.mark.parametrize("name", ["mnist-mlp", "mnist-cnn", "digits"])
def test_the_example_job_files_read_and_their_models_pass_the_check(name: str) -> None:
    from agent.operator.submit import check_model

    job = read_job_file(REPO / "examples" / "jobs" / f"{name}.toml")
    assert job.name == name
    assert len(check_model(job).fingerprint) == 16
