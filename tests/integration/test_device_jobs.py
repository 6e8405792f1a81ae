"""Three device processes on one mosquitto take signed jobs one after another (issue 52):
records, a job of the thesis MLP to its rounds and its result, forged and broken jobs refused
and counted while the next job still runs, and a signed stop ending training within two rounds."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.jobs import signing
from agent.jobs.states import ExecState, RejectReason
from agent.transport.mqtt import MqttTransport
from tests.integration.device_fleet import (
    Device,
    Watcher,
    mnist_slice,
    plain_mosquitto,
    publish_blob,
    stop,
    submit,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DEVICES = ["dev-a", "dev-b", "dev-c"]
TRAIN, TEST = 1500, 500
OPTIONS: dict[str, Any] = {"eval_every": 3, "eval_samples": 500, "round_deadline": 10.0}


class Fleet:
    def __init__(self, url: str, key: Any, devices: list[Device], data: Path) -> None:
        self.url, self.key, self.devices, self.data = url, key, devices, data
        self.watcher = Watcher.connect(url)
        self.operator = MqttTransport("itest-operator", url, threaded=True)
        self.operator.connect([])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, mnist_cache_dir: Path) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("device-jobs")
    broker, url = plain_mosquitto(root)
    key = signing.generate_key()
    data = mnist_slice(mnist_cache_dir, root / "mnist-slice.npz", TRAIN, TEST)
    devices = [write_config(root, name, url, signing.public_key_text(key),
                            {"mnist": {"format": "npz", "path": str(data)}, "digits": {"format": "digits"}})
               for name in DEVICES]
    for device in devices:
        device.start()
    made = Fleet(url, key, devices, data)
    try:
        yield made
    finally:
        codes = [d.stop() for d in devices]
        made.watcher.close()
        made.operator.close()
        broker.terminate()
        broker.wait(10)
        assert codes == [0, 0, 0], [d.log.read_text()[-2000:] for d in devices]


def test_each_device_publishes_its_record_with_its_data_summary(fleet: Fleet) -> None:
    w = fleet.watcher
    w.wait(lambda: all(w.records.get(d, {}).get("state") == "idle" for d in DEVICES), 180, "idle records")
    record = w.records["dev-a"]
    assert record["labels"] == {"site": "barn"} and "numpy" in record["backends"]
    source = record["data"]["mnist"]
    assert source["format"] == "npz" and source["samples"] == TRAIN and sum(source["labels"]) == TRAIN
    assert len(source["labels"]) == 10 and record["refused"] == {}
    assert record["data"]["digits"]["samples"] == 898  # scikit-learn's digits, its training half


def test_a_signed_job_trains_on_three_devices_and_its_coordinator_publishes_the_model(fleet: Fleet) -> None:
    w = fleet.watcher
    spec = submit(fleet.operator, fleet.key, "mlp-a", DEVICES, stop={"rounds": 6}, agent_options=OPTIONS)
    w.wait(lambda: all(w.state("mlp-a", d) is ExecState.SUCCEEDED for d in DEVICES) and "mlp-a" in w.results,
           180, "mlp-a to succeed on every device")
    for device in DEVICES:
        states = w.states("mlp-a", device)
        assert states[:3] == [ExecState.QUEUED, ExecState.ACCEPTED, ExecState.TRAINING], states
        assert w.execs[("mlp-a", device)].node == spec.assignments[device]
        assert w.execs[("mlp-a", device)].round == 6
    manifest = w.results["mlp-a"]
    w.wait(lambda: all(("mlp-a", i) in w.chunks for i in range(manifest.chunks)), 30, "result chunks")
    data = w.result_bytes("mlp-a")
    assert hashlib.sha256(data).hexdigest() == manifest.params_sha256 and manifest.values == 407_050
    assert [(t.name, t.shape) for t in manifest.layout] == [("w1", [784, 512]), ("b1", [512]),
                                                            ("w2", [512, 10]), ("b2", [10])]
    assert manifest.round == 6 and manifest.node == 0 and manifest.device == "dev-a"
    # The fetched parameters score on the test set exactly what the manifest reports.
    from agent.model.mlp_model import MlpModel

    params = np.frombuffer(data, dtype="<f4").astype(np.float32)
    test = np.load(fleet.data)
    predicted = MlpModel().predict(params, test["x_test"]).argmax(axis=1)
    assert manifest.accuracy == pytest.approx(float(np.mean(predicted == test["y_test"])), abs=1e-9)
    assert manifest.accuracy is not None and manifest.accuracy > 0.5


def test_forged_and_broken_jobs_are_refused_and_counted_and_the_next_job_runs(fleet: Fleet) -> None:
    w = fleet.watcher
    stranger = signing.generate_key()
    submit(fleet.operator, stranger, "forged", DEVICES, stop={"rounds": 3}, agent_options=OPTIONS)
    model = (Path(__file__).resolve().parents[2] / "examples" / "digits" / "model.py").read_bytes()
    blob = publish_blob(fleet.operator, model + b"# tampered in transit\n",
                        claimed_sha=hashlib.sha256(model).hexdigest())
    blob["size"] = len(model)
    submit(fleet.operator, fleet.key, "badblob", DEVICES, model=blob, stop={"rounds": 3}, agent_options=OPTIONS)
    submit(fleet.operator, fleet.key, "mlp-b", DEVICES[:2], stop={"rounds": 3}, agent_options=OPTIONS)
    w.wait(lambda: all(w.state("mlp-b", d) is ExecState.SUCCEEDED for d in DEVICES[:2]), 180, "mlp-b")
    for device in DEVICES:
        forged = w.execs[("forged", device)]
        assert (forged.state, forged.reason) == (ExecState.REJECTED, RejectReason.UNKNOWN_KEY)
        broken = w.execs[("badblob", device)]
        assert (broken.state, broken.reason) == (ExecState.REJECTED, RejectReason.BLOB_HASH_MISMATCH)
        assert ExecState.DOWNLOADING in w.states("badblob", device)
    w.wait(lambda: all(w.records[d]["refused"] == {"blob_hash_mismatch": 1, "unknown_key": 1}
                       for d in DEVICES), 30, "the refusals counted in the records")
    assert ("mlp-b", "dev-c") not in w.execs  # not assigned, and it holds the data: says nothing


def test_a_model_file_is_downloaded_checked_and_trained_and_a_misfit_model_is_rejected(fleet: Fleet) -> None:
    w = fleet.watcher
    model = (Path(__file__).resolve().parents[2] / "examples" / "digits" / "model.py").read_bytes()
    blob = publish_blob(fleet.operator, model)
    submit(fleet.operator, fleet.key, "misfit", DEVICES[1:], data="digits", stop={"rounds": 3},
           agent_options=OPTIONS)  # the thesis MLP (784 inputs) on 8x8 digits
    submit(fleet.operator, fleet.key, "digits", DEVICES[:2], model=blob, data="digits",
           stop={"rounds": 5}, agent_options={**OPTIONS, "eval_samples": 899})
    w.wait(lambda: all(w.state("digits", d) is ExecState.SUCCEEDED for d in DEVICES[:2]) and "digits" in w.results,
           180, "the digits model file's job")
    for device in DEVICES[1:]:
        misfit = w.execs[("misfit", device)]
        assert (misfit.state, misfit.reason) == (ExecState.REJECTED, RejectReason.MODEL_CHECK_FAILED)
        assert misfit.detail  # the model check's own line
    assert w.states("digits", "dev-a")[:4] == [ExecState.QUEUED, ExecState.ACCEPTED, ExecState.DOWNLOADING,
                                              ExecState.TRAINING]
    manifest = w.results["digits"]
    assert manifest.values == 64 * 128 + 128 + 128 * 10 + 10 and manifest.model == blob_ref(blob)
    stored = fleet.devices[0].config.parent / "state" / "blobs" / blob["sha256"] / "model.py"
    assert stored.read_bytes() == model


def blob_ref(blob: dict[str, Any]) -> Any:
    from agent.jobs.document import BlobRef

    return BlobRef.model_validate(blob)


def test_a_signed_stop_ends_training_within_two_rounds(fleet: Fleet) -> None:
    w = fleet.watcher
    rounds: dict[int, int] = {}
    telemetry = MqttTransport("itest-telemetry", fleet.url, threaded=True)
    telemetry.connect(["edgegrove/long/telemetry/+"])
    try:
        submit(fleet.operator, fleet.key, "long", DEVICES, stop={"rounds": 100000},
               agent_options={**OPTIONS, "eval_every": 0})

        def reached() -> bool:
            for m in telemetry.receive(0.05):
                report = json.loads(m.payload)
                rounds[report["node"]] = max(rounds.get(report["node"], -1), report["round"])
            return len(rounds) == 3 and min(rounds.values()) >= 2

        w.wait(reached, 180, "three devices training job long")
        stop(fleet.operator, fleet.key, "long")
        at_stop = max(rounds.values())
        w.wait(lambda: all(w.state("long", d) is ExecState.CANCELED for d in DEVICES), 60, "long canceled")
    finally:
        telemetry.close()
    finals = [w.execs[("long", d)].round or 0 for d in DEVICES]
    # An exec's round is the next round it would have run: rounds done after the stop = final - 1 - at_stop.
    assert max(finals) - 1 - at_stop <= 2, (finals, at_stop)
    w.wait(lambda: "long" in w.results, 30, "the stopped job's result")
    assert w.results["long"].states["dev-a"] is ExecState.CANCELED
    w.wait(lambda: all(w.records[d]["state"] == "idle" for d in DEVICES), 30, "the devices idle again")

