"""Start and stop brokers for tests, the simulator and ``edgegrove broker``.

``start_mosquitto`` renders the templates of ``broker-config/`` (through its
``make-credentials`` script) into a work directory, starts mosquitto on a free 127.0.0.1 port
and returns once mosquitto logs that it is running. ``start_embedded`` runs the embedded broker (rumqttd)
in a subprocess (``python -m simulate.embedded_broker``) and waits for its READY line. Both
are stopped by their process handle, and are context managers.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, Any

from agent.transport.base import TransportError
from agent.transport.mqtt import MqttTransport

REPO_ROOT = Path(__file__).resolve().parents[1]
DYNSEC_TOPIC = "$CONTROL/dynamic-security/v1"
READY_TIMEOUT_S = 15.0
_RUNNING = " running"  # mosquitto logs "mosquitto version X running" once it listens
_RELOADED = "Reloading config."  # logged when SIGHUP is handled, before the ACL is re-read


class BrokerError(RuntimeError):
    """A broker could not be started or managed; the message says why and what to do."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str
    client_id: str | None = None  # the one a dynamic-security broker admits (agents only)


def broker_config_dir() -> Path:
    """``broker-config/`` of this checkout, or $EDGEGROVE_BROKER_CONFIG."""
    path = Path(os.environ.get("EDGEGROVE_BROKER_CONFIG", REPO_ROOT / "broker-config"))
    if not (path / "make-credentials").is_file():
        raise BrokerError(f"no broker-config/make-credentials in {path}: set "
                          "EDGEGROVE_BROKER_CONFIG to the broker-config directory of Edgegrove")
    return path


def _load_make_credentials() -> ModuleType:
    path = broker_config_dir() / "make-credentials"
    loader = importlib.machinery.SourceFileLoader("edgegrove_make_credentials", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def mosquitto_binary() -> str | None:
    """The mosquitto to run; ``EDGEGROVE_MOSQUITTO`` names one, or ``none`` to act as if
    there were none (to exercise the embedded fallback)."""
    override = os.environ.get("EDGEGROVE_MOSQUITTO")
    if override is not None:
        return None if override.lower() in ("", "none") else shutil.which(override)
    found = shutil.which("mosquitto")
    if found is None and Path("/usr/sbin/mosquitto").exists():
        found = "/usr/sbin/mosquitto"
    return found


def mosquitto_available() -> bool:
    return mosquitto_binary() is not None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _LineWatcher:
    """Drains a child's output pipe into a log file, counting lines that contain markers.

    The pipe must be drained for the child's whole life, or a chatty broker blocks on it.
    ``wait`` returns when a marker has been seen ``count`` times, or the stream ended.
    """

    def __init__(self, stream: IO[str], log_path: Path, markers: tuple[str, ...]) -> None:
        self.markers = markers
        self.first: dict[str, str] = {}
        self._counts = dict.fromkeys(markers, 0)
        self._ended = False
        self._cond = threading.Condition()
        self._stream = stream
        self._log_path = log_path
        self._thread = threading.Thread(target=self._run, daemon=True, name="broker-log")
        self._thread.start()

    def _run(self) -> None:
        with open(self._log_path, "a") as log:
            for line in self._stream:
                log.write(line)
                log.flush()
                with self._cond:
                    for marker in self.markers:
                        if marker in line:
                            self._counts[marker] += 1
                            self.first.setdefault(marker, line.strip())
                    self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def count(self, marker: str) -> int:
        with self._cond:
            return self._counts[marker]

    def wait(self, marker: str, count: int, timeout: float) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._counts[marker] >= count or self._ended, timeout)
            return self._counts[marker] >= count

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop_process(proc: subprocess.Popen[str], timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class MosquittoBroker:
    """A running mosquitto rendered from broker-config/. Create with ``start_mosquitto``."""

    def __init__(self, workdir: Path, conf: Path, port: int, host: str, credentials: dict[str, Any],
                 dynsec: bool, tls: bool) -> None:
        self.workdir = workdir
        self.conf = conf
        self.port = port
        self.host = host
        self.dynsec = dynsec
        self.tls = tls
        self.prefix: str = credentials["prefix"]
        self.job: str = credentials["job"]
        self.credentials_path = workdir / "credentials.json"
        self.log_path = workdir / "mosquitto.log"
        self.ca_file: str | None = str(workdir / "certs" / "ca.crt") if tls else None
        self._credentials = credentials
        self._proc: subprocess.Popen[str] | None = None
        self._watcher: _LineWatcher | None = None
        self._admin: DynsecAdmin | None = None
        self._revoked: set[tuple[int, int]] = set()
        self._acl_base = (workdir / "acl").read_text()
        self.command_prefix: tuple[str, ...] = ()  # e.g. ``ip netns exec NS``: a site's namespace
        # The dynamic-security role that holds node N's link topics: the agent's own, or the
        # job role `job submit` grants a device for node N (simulate --via-devices).
        self.node_role: Callable[[int], str] = lambda node: f"agent-{node}"

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise BrokerError("mosquitto is not installed: run scripts/setup.sh (apt-get install "
                              "mosquitto) or use the embedded broker (--kind embedded)")
        self._proc = subprocess.Popen(
            [*self.command_prefix, binary, "-c", str(self.conf)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )
        assert self._proc.stderr is not None
        self._watcher = _LineWatcher(self._proc.stderr, self.log_path, (_RUNNING, _RELOADED))
        if not self._watcher.wait(_RUNNING, 1, READY_TIMEOUT_S):
            self.stop()
            raise BrokerError(f"mosquitto did not start on {self.host}:{self.port} "
                              f"(config {self.conf}); its log ends with:\n"
                              f"{_log_tail(self.log_path)}")

    def stop(self) -> None:
        """Stop the broker by its process handle; idempotent."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._proc is not None:
            _stop_process(self._proc)
            self._proc = None
        if self._watcher is not None:
            self._watcher.join(5.0)
            self._watcher = None

    def restart(self) -> None:
        """Stop and start again on the same port with the same credentials."""
        self.stop()
        self.start()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> MosquittoBroker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- addresses and credentials ----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    def credentials_for(self, node: int) -> Credentials:
        entry = self._credentials["agents"].get(str(node))
        if entry is None:
            raise KeyError(f"no credentials for node {node}: the broker was set up for nodes "
                           f"{', '.join(self._credentials['agents'])}")
        return Credentials(entry["username"], entry["password"], entry.get("client_id"))

    def device_credentials(self, name: str) -> Credentials:
        """An installed device's user (``start_mosquitto(devices=...)``)."""
        entry = self._credentials.get("devices", {}).get(name)
        if entry is None:
            raise KeyError(f"no credentials for device {name}: the broker was set up for devices "
                           f"{', '.join(self._credentials.get('devices', {})) or '(none)'}")
        return Credentials(entry["username"], entry["password"], entry.get("client_id"))

    @property
    def operator_credentials(self) -> Credentials:
        """The operator (`edgegrove job submit / fetch`, `edgegrove devices`)."""
        return Credentials(**self._credentials["operator"])

    @property
    def dashboard_credentials(self) -> Credentials:
        return Credentials(**self._credentials["dashboard"])

    @property
    def dashboard_control_credentials(self) -> Credentials:
        """The dashboard with fault controls: the dashboard's reads and the job's control topic."""
        return Credentials(**self._credentials["dashboard_control"])

    @property
    def admin_credentials(self) -> Credentials:
        return Credentials(**self._credentials["admin"])

    # -- dynamic security -------------------------------------------------------------------

    def revoke_link(self, src: int, dst: int) -> None:
        """Agent ``src`` may no longer publish on link/src/dst: the broker drops it silently.

        With dynsec: an ACL through ``$CONTROL/dynamic-security/v1``. mosquitto 2.0 then
        disconnects every client of the changed role, so agent ``src`` reconnects once (about
        0.2 s; no Last Will is sent). Without dynsec: a ``topic deny`` line in the acl file and
        SIGHUP, which mosquitto applies to connected clients without disconnecting anyone.
        """
        if self.dynsec:
            self._dynsec({"command": "addRoleACL", "rolename": self.node_role(src),
                          "acltype": "publishClientSend", "topic": self._link(src, dst),
                          "priority": 100, "allow": False})
        else:
            self._revoked.add((src, dst))
            self._reload_acl()

    def restore_link(self, src: int, dst: int) -> None:
        if self.dynsec:
            self._dynsec({"command": "removeRoleACL", "rolename": self.node_role(src),
                          "acltype": "publishClientSend", "topic": self._link(src, dst)})
        else:
            self._revoked.discard((src, dst))
            self._reload_acl()

    def _reload_acl(self) -> None:
        if self._proc is None or self._watcher is None:
            raise BrokerError("mosquitto is not running")
        lines: list[str] = []
        for line in self._acl_base.splitlines():
            lines.append(line)
            words = line.split()
            if words[:1] == ["user"] and words[1].startswith("agent-"):
                src = words[1].removeprefix("agent-")
                lines += [f"topic deny {self._link(int(src), d)}"
                          for s, d in sorted(self._revoked) if str(s) == src]
        acl = self.workdir / "acl"
        tmp = acl.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(acl)
        seen = self._watcher.count(_RELOADED)
        self._proc.send_signal(signal.SIGHUP)
        if not self._watcher.wait(_RELOADED, seen + 1, 5.0):
            raise BrokerError(f"mosquitto did not reload its ACL; see {self.log_path}")

    def _link(self, src: int, dst: int) -> str:
        return f"{self.prefix}/link/{src}/{dst}"

    def _dynsec(self, command: dict[str, Any], timeout: float = 5.0) -> None:
        if not self.dynsec:
            raise BrokerError("this mosquitto runs without the dynamic-security plugin: start it "
                              "with dynsec=True to revoke links at the broker")
        if self._admin is None:
            self._admin = DynsecAdmin(self.url, self.admin_credentials, self.prefix, self.ca_file)
        self._admin.command(command, timeout)


class DynsecAdmin:
    """The ``admin`` user of any mosquitto with the dynamic-security plugin (ours or one the
    user runs, e.g. ``edgegrove broker``): revokes and restores link topics at run time."""

    def __init__(self, url: str, admin: Credentials, prefix: str,
                 ca_file: str | None = None) -> None:
        self.url = url
        self.prefix = prefix
        self._creds = admin
        self._ca_file = ca_file
        self._client: MqttTransport | None = None

    def revoke_link(self, src: int, dst: int) -> None:
        self.command({"command": "addRoleACL", "rolename": f"agent-{src}",
                      "acltype": "publishClientSend", "topic": f"{self.prefix}/link/{src}/{dst}",
                      "priority": 100, "allow": False})

    def restore_link(self, src: int, dst: int) -> None:
        self.command({"command": "removeRoleACL", "rolename": f"agent-{src}",
                      "acltype": "publishClientSend", "topic": f"{self.prefix}/link/{src}/{dst}"})

    def probe(self, timeout: float = 5.0) -> str:
        """'' when the broker answers dynamic-security commands of this admin, else why not."""
        try:
            self.command({"command": "getRole", "rolename": "admin"}, timeout)
        except (BrokerError, TransportError, OSError) as exc:
            self.close()
            return str(exc)
        return ""

    def command(self, command: dict[str, Any], timeout: float = 5.0) -> None:
        admin = self._connected()
        correlation = uuid.uuid4().hex
        command = {**command, "correlationData": correlation}
        admin.publish(DYNSEC_TOPIC, json.dumps({"commands": [command]}).encode())
        response = self._await_response(admin, correlation, timeout)
        if response.get("error"):
            raise BrokerError(f"dynamic-security refused {command['command']}: "
                              f"{response['error']}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _connected(self) -> MqttTransport:
        if self._client is None:
            client = MqttTransport(f"edgegrove-admin-{uuid.uuid4().hex[:8]}", self.url,
                                   username=self._creds.username, password=self._creds.password,
                                   tls_ca=self._ca_file)
            client.connect([f"{DYNSEC_TOPIC}/response"])
            self._client = client
        return self._client

    @staticmethod
    def _await_response(admin: MqttTransport, correlation: str, timeout: float) -> dict[str, Any]:
        # The SUBACK of the response topic may still be in flight on the first command, but
        # mosquitto handles our packets in order, so the response cannot overtake it.
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            for msg in admin.receive(remaining):
                for response in json.loads(msg.payload).get("responses", []):
                    if response.get("correlationData") == correlation:
                        return dict(response)
        raise BrokerError(f"no answer from the dynamic-security plugin within {timeout:.0f} s")


# The template each choice runs: (dynamic security, TLS) -> file.
CONFIGS = {(True, True): "mosquitto-dynsec-tls.conf", (True, False): "mosquitto-dynsec.conf",
           (False, True): "mosquitto-tls.conf", (False, False): "mosquitto.conf"}


def start_mosquitto(
    workdir: str | Path, *, job: str, nodes: int | Iterable[int], port: int | None = None,
    dynsec: bool = True, tls: bool = False, bind: str = "127.0.0.1", prefix: str = "",
    persistence: bool = True, bind_client_ids: bool = True, devices: Iterable[str] = (),
) -> MosquittoBroker:
    """Render broker-config/ into ``workdir``, start mosquitto, return once it is running.

    ``nodes`` is a count (ids 0..n-1) or the ids. ``port=None`` picks a free one (and another
    if that was taken meanwhile). ``tls=True`` creates a throw-away CA and server certificate
    with openssl (``broker.ca_file``); with ``dynsec`` too (mosquitto-dynsec-tls.conf).
    ``persistence`` (on, as in the templates) keeps retained statuses and the view in
    ``workdir/mosquitto.db`` across ``restart()``; off, a restart forgets them.
    ``bind_client_ids`` (dynsec): each agent user may connect only with its client id from
    credentials.json; off, tests can stand a second session with an agent's credentials in
    for what a compromised device would send over its own. ``devices``: installed devices'
    users (``device_credentials``), and the operator's.
    """
    workdir = Path(workdir).resolve()
    node_ids = list(range(nodes)) if isinstance(nodes, int) else sorted(set(nodes))
    make_credentials = _load_make_credentials()
    if tls:
        make_test_certificates(workdir / "certs")
    attempts = 1 if port is not None else 3
    last_error: BrokerError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_port(bind if bind != "0.0.0.0" else "127.0.0.1")
        creds = make_credentials.make_credentials(workdir, node_ids, job=job, prefix=prefix,
                                                  bind=bind, port=chosen, bind_client_ids=bind_client_ids,
                                                  devices=list(devices))
        conf = workdir / CONFIGS[dynsec, tls]
        set_persistence(conf, persistence)
        host = "127.0.0.1" if bind in ("0.0.0.0", "") else bind
        broker = MosquittoBroker(workdir, conf, chosen, host, creds, dynsec, tls)
        try:
            broker.start()
            return broker
        except BrokerError as exc:
            last_error = exc
            if "Address already in use" not in str(exc):
                raise
    assert last_error is not None
    raise last_error


def set_persistence(conf: Path, on: bool) -> None:
    """Turn the rendered config's ``persistence`` line on or off."""
    lines = conf.read_text().splitlines()
    if not any(line.startswith("persistence ") for line in lines):
        raise BrokerError(f"{conf} has no `persistence` line: is it from broker-config/?")
    value = "true" if on else "false"
    conf.write_text("\n".join(f"persistence {value}" if line.startswith("persistence ") else line
                              for line in lines) + "\n")


def make_test_certificates(certs_dir: Path, host: str = "127.0.0.1") -> Path:
    """A throw-away CA and a server certificate for ``host`` (openssl); returns the CA file."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BrokerError("openssl is not installed: install it (apt-get install openssl) to "
                          "generate test certificates, or bring your own into certs/")
    certs_dir.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (certs_dir / "server.ext").write_text(
        f"subjectAltName=IP:{host},DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    steps = [
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
         "-subj", "/CN=edgegrove-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={host}"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "server.crt", "-days", "30", "-extfile", "server.ext"],
    ]
    for step in steps:
        done = subprocess.run([openssl, *step], cwd=certs_dir, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise BrokerError(f"openssl {step[0]} failed: {done.stderr.strip()[-500:]}")
    os.chmod(certs_dir / "server.key", 0o600)
    return certs_dir / "ca.crt"


class EmbeddedBroker:
    """The embedded rumqttd broker (MQTT 3.1.1, anonymous) in a child process. Create with ``start_embedded``."""

    def __init__(self, proc: subprocess.Popen[str], watcher: _LineWatcher, url: str,
                 log_path: Path) -> None:
        self._proc: subprocess.Popen[str] | None = proc
        self._watcher = watcher
        self.url = url
        self.log_path = log_path

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        if self._proc is not None:
            _stop_process(self._proc)
            self._proc = None
            self._watcher.join(5.0)

    def __enter__(self) -> EmbeddedBroker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_embedded(port: int | None = None, host: str = "127.0.0.1",
                   log_path: str | Path | None = None) -> EmbeddedBroker:
    """Start the embedded broker (port None: a free one); return once it accepts connections."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    log = Path(log_path) if log_path else Path(os.devnull)
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulate.embedded_broker", "--host", host, "--port",
         str(port or 0)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env,
    )
    assert proc.stdout is not None
    watcher = _LineWatcher(proc.stdout, log, ("READY ",))
    if not watcher.wait("READY ", 1, READY_TIMEOUT_S):
        _stop_process(proc)
        raise BrokerError(f"the embedded broker did not start on {host}:{port or 'a free port'}"
                          + ("" if log_path is None else f"; see {log}"))
    url = watcher.first["READY "].split()[1]
    return EmbeddedBroker(proc, watcher, url, log)


__all__ = [
    "BrokerError", "Credentials", "DynsecAdmin", "EmbeddedBroker", "MosquittoBroker",
    "broker_config_dir", "free_port", "make_test_certificates", "mosquitto_available",
    "set_persistence", "start_embedded", "start_mosquitto",
]
