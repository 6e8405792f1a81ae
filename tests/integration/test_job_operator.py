"""The operator's commands against a real mosquitto with dynamic security, devices stood in by
their retained records: submit (assignment, blob, grants, signature), status, stop, fetch and
evaluate. The devices themselves run in tests/integration/test_job_fleet.py."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.cli import COMMANDS, dispatch
from agent.commands.job_submit import dynsec
from agent.jobs import topics
from agent.jobs.document import (
    ControlMessage,
    DataSourceInfo,
    DeviceRecord,
    JobSpec,
    ResultManifest,
    TensorLayout,
)
from agent.jobs.signing import KeyRing, canonical_json, open_signed, parse_public_key
from agent.jobs.states import ControlAction, ExecState
from agent.model.contract import Model
from agent.model.data import load_mnist, to_float_pixels
from agent.model.flat import params_hash
from agent.model.loader import load_model
from agent.operator.blobs import cut
from agent.operator.connection import BrokerLogin, OperatorClient
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker
from tests.integration.conftest import TransportFactory, collect

REPO = Path(__file__).resolve().parents[2]
EVERYTHING = "edgegrove/#"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = dispatch("edgegrove", "test", COMMANDS, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def broker(mosquitto_factory: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    """Dynamic security on; the admin (our operator) may read and write all of edgegrove/."""
    started = mosquitto_factory(dynsec=True, nodes=3)
    acls = [{"acltype": kind, "topic": EVERYTHING, "allow": True}
            for kind in ("subscribePattern", "publishClientReceive", "publishClientSend")]
    creds = started.admin_credentials
    login = BrokerLogin(started.url, creds.username, creds.password)
    # The plugin drops the admin's connection when its roles change: the answer may not come.
    dynsec(login, [{"command": "createRole", "rolename": "operator-all", "acls": acls},
                   {"command": "addClientRole", "username": "admin", "rolename": "operator-all"}], 2.0)
    with OperatorClient(login, ["edgegrove/probe"]) as probe:
        probe.publish("edgegrove/probe", b"1")
        assert [m.payload for m in probe.sync()] == [b"1"], "the admin did not get edgegrove/#"
    return started


@pytest.fixture
def operator(tmp_path: Path, broker: MosquittoBroker, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The broker and key options every command takes."""
    code, _, _ = cli(capsys, "job", "keygen", "-o", str(tmp_path / "keys"))
    assert code == 0
    return ["--broker", broker.url, "--credentials", str(broker.credentials_path)]


def key_of(tmp_path: Path) -> list[str]:
    return ["--key", str(tmp_path / "keys" / "operator.key")]


def keyring(tmp_path: Path) -> KeyRing:
    return KeyRing.of([parse_public_key(str(tmp_path / "keys" / "operator.pub"))])


def enroll(transport: MqttTransport, device: str, data: tuple[str, ...]) -> None:
    record = DeviceRecord(id=device, labels={"site": "barn"}, arch="aarch64", backends=["numpy", "litert"],
                          data={d: DataSourceInfo(format=d, samples=100) for d in data}, last_seen=1.0)
    transport.publish(topics.device_record(device), canonical_json(record).encode(), retain=True, reliable=True)


def job_file(tmp_path: Path, name: str, extra: str = "", data: str = "mnist", min_devices: int = 2) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\ndata = "{data}"\nmin_devices = {min_devices}\n{extra}\n[stop]\nrounds = 5\n')
    return str(path)


def retained_payload(transport_factory: TransportFactory, broker: MosquittoBroker, topic: str) -> bytes:
    reader = transport_factory(broker, "admin", [topic])
    return collect(reader, lambda got: any(m.topic == topic for m in got))[-1].payload


def test_submit_assigns_the_devices_with_the_data_grants_their_topics_and_signs(
        tmp_path: Path, broker: MosquittoBroker, operator: list[str], capsys: pytest.CaptureFixture[str],
        transport_factory: TransportFactory) -> None:
    admin = transport_factory(broker, "admin", [])
    for device, data in (("agent-0", ("mnist",)), ("agent-1", ("mnist", "digits")), ("agent-2", ("digits",))):
        enroll(admin, device, data)
    watcher = transport_factory(broker, "admin", ["edgegrove/barn/status/+"])
    device1 = transport_factory(broker, 1, [])
    device1.publish("edgegrove/barn/status/1", b"before", reliable=True)

    code, out, err = cli(capsys, "job", "submit", job_file(tmp_path, "barn"), *key_of(tmp_path),
                         "--device-user", "{device}", *operator)
    assert code == 0, err
    assert "skipped agent-2: no data source mnist" in err
    assert "agent-0=0, agent-1=1" in out
    spec = open_signed(retained_payload(transport_factory, broker, topics.job_spec("barn")),
                       keyring(tmp_path), JobSpec)
    assert spec.assignments == {"agent-0": 0, "agent-1": 1} and spec.stop.rounds == 5

    # the grant: agent-1 may now write its own node's status in job barn, and no other node's
    device1.publish("edgegrove/barn/status/0", b"forged", reliable=True)
    device1.publish("edgegrove/barn/status/1", b"granted", reliable=True)
    got = collect(watcher, lambda seen: any(m.payload == b"granted" for m in seen))
    assert [m.payload for m in got] == [b"granted"]  # neither "before" the grant nor the forgery

    code, _, err = cli(capsys, "job", "submit", job_file(tmp_path, "barn"), *key_of(tmp_path), *operator)
    assert code == 2 and "exists already" in err and err.count("\n") == 1
    code, _, err = cli(capsys, "job", "submit", job_file(tmp_path, "big", min_devices=3),
                       *key_of(tmp_path), *operator)
    assert code == 2 and "fewer than min_devices 3" in err and err.count("\n") == 1
    code, _, err = cli(capsys, "job", "submit", job_file(tmp_path, "cams", data="cams"),
                       *key_of(tmp_path), *operator)
    assert code == 2 and "data source 'cams'" in err

    code, out, _ = cli(capsys, "devices", "--json", *operator)
    assert code == 0 and [d["id"] for d in json.loads(out)] == ["agent-0", "agent-1", "agent-2"]
    code, out, _ = cli(capsys, "job", "list", *operator)
    assert code == 0 and "barn" in out and "no state 2" in out

    code, out, _ = cli(capsys, "job", "stop", "barn", *key_of(tmp_path), *operator)
    assert code == 0, out
    control = open_signed(retained_payload(transport_factory, broker, topics.job_control("barn")),
                          keyring(tmp_path), ControlMessage)
    assert control.action == ControlAction.STOP

    # submitted again with --replace: the stop and the old document are gone, a new one is there
    code, _, err = cli(capsys, "job", "submit", job_file(tmp_path, "barn", min_devices=1), *key_of(tmp_path),
                       "--replace", "--device-user", "{device}", *operator)
    assert code == 0, err
    code, out, _ = cli(capsys, "job", "status", "barn", "--json", *operator)
    status = json.loads(out)
    assert code == 0 and status["stopped"] is False and status["spec"]["min_devices"] == 1


def test_a_tflite_job_sends_its_model_file_as_content_addressed_chunks(
        tmp_path: Path, broker: MosquittoBroker, operator: list[str], capsys: pytest.CaptureFixture[str],
        transport_factory: TransportFactory) -> None:
    admin = transport_factory(broker, "admin", [])
    for device in ("pi-a", "pi-b"):
        enroll(admin, device, ("mnist",))
    cnn = REPO / "examples" / "mnist_cnn" / "mnist_cnn.tflite"
    code, _, err = cli(capsys, "job", "submit", job_file(tmp_path, "cnn", f'model = "{cnn}"'),
                       *key_of(tmp_path), "--grants", "none", *operator)
    assert code == 0, err
    spec = open_signed(retained_payload(transport_factory, broker, topics.job_spec("cnn")),
                       keyring(tmp_path), JobSpec)
    assert not isinstance(spec.model, str) and spec.backend == "litert"
    blob = spec.model
    reader = transport_factory(broker, "admin", [topics.blob_chunks(blob.sha256)])
    chunks = collect(reader, lambda got: len(got) >= blob.chunks)
    data = b"".join(m.payload for m in sorted(chunks, key=lambda m: topics.parse_blob_chunk(m.topic) or ("", 0)))
    assert hashlib.sha256(data).hexdigest() == blob.sha256 == hashlib.sha256(cnn.read_bytes()).hexdigest()


def test_fetch_writes_a_result_that_evaluates_as_the_fleet_reported(
        tmp_path: Path, broker: MosquittoBroker, operator: list[str], capsys: pytest.CaptureFixture[str],
        transport_factory: TransportFactory, mnist_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEGROVE_CACHE_DIR", str(mnist_cache_dir))
    model = load_model("mlp")
    params = _trained_mlp(model)
    data = params.astype("<f4").tobytes()
    manifest = ResultManifest(
        job="done", device="pi-a", node=0, round=60, accuracy=None, loss=0.2, model="mlp",
        model_hash=f"{params_hash(params):08x}", fingerprint="0" * 16,
        params_sha256=hashlib.sha256(data).hexdigest(), values=params.size, chunk_size=256 * 1024,
        chunks=len(cut(data, 256 * 1024)), layout=[TensorLayout(name=t.name, shape=list(t.shape)) for t in model.tensors],
        states={"pi-a": ExecState.SUCCEEDED, "pi-b": ExecState.SUCCEEDED}, published_at=1.0)
    admin = transport_factory(broker, "admin", [])
    for index, chunk in enumerate(cut(data, 256 * 1024)):
        admin.publish(topics.job_result_chunk("done", index), chunk, retain=True, reliable=True)
    admin.publish(topics.job_result("done"), canonical_json(manifest).encode(), retain=True, reliable=True)
    # On the broker before the fetch starts: published QoS 1 from paho's thread, on a loaded
    # host (CI beside a fleet) it was still on its way when the fetch's wait ran out.
    assert retained_payload(transport_factory, broker, topics.job_result("done")) == canonical_json(manifest).encode()

    out_dir = tmp_path / "fetched"
    code, out, err = cli(capsys, "job", "fetch", "done", "-o", str(out_dir), "--wait", "10", *operator)
    assert code == 0, err
    assert {p.name for p in out_dir.iterdir()} == {"model.npz", "model.tflite", "metrics.json"}
    scores = []
    for trained in ("model.npz", "model.tflite"):
        code, out, err = cli(capsys, "model", "evaluate", str(out_dir / trained), "--dataset",
                             "mnist", "--json")
        assert code == 0, err
        scores.append(json.loads(out))
    assert scores[0]["samples"] == scores[1]["samples"] == 10000
    assert abs(scores[0]["accuracy"] - scores[1]["accuracy"]) <= 2e-4  # float32 sums in another order
    assert scores[0]["accuracy"] > 0.8


def _trained_mlp(model: Model) -> np.ndarray:
    """200 SGD steps of the thesis MLP on MNIST: weights a fetched model can be scored on."""
    data = load_mnist()
    params = model.initial_params(0)
    for step in range(200):
        rows = slice(step * 100, step * 100 + 100)
        _, grad = model.loss_and_grad(params, to_float_pixels(data.x_train[rows]), data.y_train[rows])
        params = (params - np.float32(0.1) * grad).astype(np.float32)
    return params
