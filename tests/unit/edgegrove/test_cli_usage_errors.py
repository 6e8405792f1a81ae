"""Every bad argument or file of every command is ONE line on stderr and exit code 2, before
anything starts (no process, no socket, no thread, no run directory)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from edgegrove.cli import main

# {tmp}: a fresh directory; {file}: a regular file in it; {toml}: a file that is not TOML;
# {json}: a file that is not a credentials.json; {missing}: a path that does not exist.
CASES: dict[str, tuple[list[str], str]] = {
    # edgegrove agent
    "agent-http-url": (["agent", "--id", "0", "--broker", "http://127.0.0.1:1883"], "not a broker URL"),
    "agent-not-a-url": (["agent", "--id", "0", "--broker", "not a url"], "not a broker URL"),
    "agent-port-99999": (["agent", "--id", "0", "--broker", "mqtt://127.0.0.1:99999"], "1..65535"),
    "agent-credentials-dir": (["agent", "--id", "0", "--credentials", "{tmp}"], "is a directory"),
    "agent-credentials-not-json": (["agent", "--id", "0", "--credentials", "{toml}"], "no entry agents.0"),
    "agent-config-dir": (["agent", "--id", "0", "--config", "{tmp}"], "is a directory"),
    "agent-config-missing": (["agent", "--id", "0", "--config", "{missing}"], "does not exist"),
    "agent-config-not-toml": (["agent", "--id", "0", "--config", "{toml}"], "not valid TOML"),
    "agent-checkpoint-dir-is-file": (["agent", "--id", "0", "--checkpoint-dir", "{file}"], "is a file"),
    "agent-tls-ca-without-mqtts": (["agent", "--id", "0", "--tls-ca", "{file}"], "not mqtts://"),
    "agent-data-missing": (["agent", "--id", "0", "--data", "{missing}"], "does not exist"),
    "agent-rounds-negative": (["agent", "--id", "0", "--rounds", "-3"], "rounds"),
    "agent-id-not-a-number": (["agent", "--id", "abc"], "invalid int value"),
    "agent-unknown-flag": (["agent", "--id", "0", "--frobnicate"], "unrecognized arguments"),
    # edgegrove simulate
    "simulate-nodes-0": (["simulate", "--nodes", "0"], "1..256"),
    "simulate-nodes-minus-2": (["simulate", "--nodes", "-2"], "1..256"),
    "simulate-nodes-2000": (["simulate", "--nodes", "2000"], "1..256"),
    "simulate-rounds-minus-3": (["simulate", "--rounds", "-3"], "--rounds 1 or more"),
    "simulate-rounds-0": (["simulate", "--rounds", "0"], "--rounds 1 or more"),
    "simulate-http-url": (["simulate", "--broker", "http://127.0.0.1:1883"], "not a broker URL"),
    "simulate-not-a-url": (["simulate", "--broker", "not a url"], "not a broker URL"),
    "simulate-port-99999": (["simulate", "--broker", "mqtt://127.0.0.1:99999"], "1..65535"),
    "simulate-site-blind-without-sites": (["simulate", "--site-blind"], "add --sites N"),
    "simulate-site-netns-without-sites": (["simulate", "--site-netns"], "add --sites N"),
    "simulate-credentials-dir": (["simulate", "--broker", "mqtt://127.0.0.1:1883", "--credentials", "{tmp}"],
                                 "is a directory"),
    "simulate-credentials-not-json": (["simulate", "--broker", "mqtt://127.0.0.1:1883",
                                       "--credentials", "{json}"], "make-credentials"),
    "simulate-credentials-own-broker": (["simulate", "--broker", "embedded", "--credentials", "{json}"],
                                        "drop it"),
    "simulate-out-under-a-file": (["simulate", "--out", "{file}/run"], "is a file"),
    "simulate-out-unwritable": (["simulate", "--out", "/proc/edgegrove-no-such/run"], "cannot be written"),
    "simulate-dashboard-port": (["simulate", "--dashboard-port", "99999"], "0..65535"),
    "simulate-ready-timeout": (["simulate", "--ready-timeout", "-1"], "seconds > 0"),
    "simulate-scenario-dir": (["simulate", "--scenario", "{tmp}"], "cannot be read"),
    "simulate-agent-option": (["simulate", "--agent-option", "algorithm=gossip"], "ft-tree"),
    "simulate-nodes-not-a-number": (["simulate", "--nodes", "many"], "invalid int value"),
    "simulate-partition-dirichlet-negative": (["simulate", "--partition", "dirichlet:-1"], "dirichlet:ALPHA"),
    "simulate-partition-shards-0": (["simulate", "--partition", "shards:0"], "shards:K (K >= 1)"),
    "simulate-dataset-missing": (["simulate", "--dataset", "{missing}"], "neither mnist nor digits"),
    "simulate-model-missing": (["simulate", "--model", "{missing}.py:factory"], "does not exist"),
    "simulate-litert-with-py-model": (["simulate", "--backend", "litert", "--model", "{py}:factory"],
                                      "runs the thesis MLP or a .tflite"),
    "simulate-factory-raises": (["simulate", "--model", "{raises}:factory"], "raised RuntimeError: broken"),
    "simulate-backend-unknown": (["simulate", "--backend", "torch"], "use numpy, litert, mixed"),
    "simulate-numpy-model-alone": (["simulate", "--numpy-model", "{py}:factory"], "--backend mixed"),
    "simulate-partition-with-non-iid": (["simulate", "--partition", "shards:2", "--agent-option",
                                         "non_iid=true"], "both say how to split"),
    # edgegrove broker
    "broker-port-99999": (["broker", "--port", "99999"], "0..65535"),
    "broker-port-negative": (["broker", "--port", "-1"], "0..65535"),
    "broker-nodes-0": (["broker", "--nodes", "0"], "1..1024"),
    "broker-workdir-is-file": (["broker", "--workdir", "{file}"], "is a file"),
    "broker-bind-not-an-address": (["broker", "--bind", "not a url"], "not an address"),
    "broker-bad-job": (["broker", "--job", "a b"], "job name"),
    "broker-embedded-tls": (["broker", "--kind", "embedded", "--tls"], "--tls is for mosquitto"),
    "broker-sites-0": (["broker", "--sites", "0"], "1..64"),
    "broker-sites-embedded": (["broker", "--sites", "2", "--kind", "embedded"], "--sites needs mosquitto"),
    "broker-sites-tls": (["broker", "--sites", "2", "--tls"], "drop --tls"),
    "broker-sites-more-than-nodes": (["broker", "--sites", "5", "--nodes", "3"], "every site"),
    # edgegrove bench ...
    "bench-broker-out-dir": (["bench", "broker", "--out", "{tmp}"], "is a directory"),
    "bench-agent-nodes-0": (["bench", "agent", "--nodes", "0"], "1..256"),
    "bench-agent-rounds-0": (["bench", "agent", "--rounds", "0"], "at least 1"),
    "bench-agent-timeout": (["bench", "agent", "--timeout", "-5"], "seconds > 0"),
    "bench-allreduce-merge-missing": (["bench", "allreduce", "--merge", "{missing}"], "does not exist"),
    "bench-allreduce-keep-file": (["bench", "allreduce", "--keep", "{file}"], "is a file"),
    "bench-allreduce-nodes": (["bench", "allreduce", "--nodes", "3"], "--nodes >= 7"),
    "bench-accuracy-rounds-0": (["bench", "accuracy", "--rounds", "0"], "--rounds >= 1"),
    "bench-loss-p": (["bench", "loss", "--p", "1.5"], "p < 1"),
    "bench-links-wire-bfloat16": (["bench", "links", "--wires", "bfloat16"], "invalid choice: 'bfloat16'"),
    "bench-links-rate-0": (["bench", "links", "--rates", "6", "0"], "MB/s >= 0.001"),
    "bench-links-own-option": (["bench", "links", "--agent-option", "wire_dtype=int8"], "sets it itself"),
    "bench-links-bad-option": (["bench", "links", "--agent-option", "round_deadline=0"], "round_deadline"),
    "bench-links-keep-file": (["bench", "links", "--keep", "{file}"], "is a file"),
    "bench-round-profile-broker-json": (["bench", "round-profile", "--broker-json", "{missing}"],
                                        "does not exist"),
    "bench-round-profile-warmup": (["bench", "round-profile", "--rounds", "5", "--warmup", "5"],
                                   "--warmup"),
    "bench-isolation-plot-dir": (["bench", "isolation", "--plot", "{tmp}"], "is a directory"),
    "bench-gloo-timeout": (["bench", "gloo", "--timeout", "0"], "seconds > 0"),
    "bench-model-steps": (["bench", "model", "--steps", "0"], "--steps"),
    "bench-report-out-dir": (["bench", "report", "--out", "{tmp}"], "is a directory"),
    # edgegrove analyze ...
    "analyze-isolation-plot": (["analyze", "isolation", "--plot", "{file}/fig.png"], "is a file"),
    "analyze-isolation-trials": (["analyze", "isolation", "--trials", "0"], "--trials"),
    "analyze-fault-cost-nodes": (["analyze", "fault-cost", "--nodes", "1"], "--nodes >= 2"),
    # edgegrove train-local, topology
    "train-local-data-missing": (["train-local", "--data", "{missing}"], "does not exist"),
    "train-local-cache-dir-is-file": (["train-local", "--cache-dir", "{file}"], "is a file"),
    "train-local-epochs-0": (["train-local", "--epochs", "0"], "--epochs"),
    "topology-arity-1": (["topology", "--nodes", "7", "--arity", "1"], "--arity"),
}


class Started(AssertionError):
    """Something started although the arguments were refused."""


@pytest.fixture
def nothing_may_start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Refuse (and record) every process, socket and thread the test's own thread tries to
    start: the command runs there, and a thread it started would be refused at its start.
    Other threads of this worker (an earlier test's, winding down) go on as before: one of
    them binding a socket failed a case on a loaded host."""
    started: list[str] = []
    ours = threading.get_ident()

    def refuse(what: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != ours:
                return original(*args, **kwargs)
            started.append(what)
            raise Started(f"{what} started")
        return call

    for owner, name, what in ((subprocess.Popen, "__init__", "a process"), (socket.socket, "connect", "a socket connect"),
                              (socket.socket, "bind", "a socket bind"), (threading.Thread, "start", "a thread")):
        monkeypatch.setattr(owner, name, refuse(what, getattr(owner, name)))
    return started


def _fill(argv: list[str], tmp: Path) -> list[str]:
    files = {"tmp": tmp, "file": tmp / "a-file", "toml": tmp / "bad.toml", "json": tmp / "bad.json",
             "missing": tmp / "missing.json", "py": tmp / "model.py", "raises": tmp / "raises.py"}
    (tmp / "raises.py").write_text("def factory():\n    raise RuntimeError('broken')\n")
    (tmp / "a-file").write_text("a regular file\n")
    (tmp / "model.py").write_text("def factory(): ...\n")
    (tmp / "bad.toml").write_text("x = = 1\n")
    (tmp / "bad.json").write_text('{"agents": {}}\n')
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as done:  # argparse's errors, while parsing
        return int(done.code or 0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_one_line_and_exit_2_before_anything_starts(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_may_start: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    template, message = CASES[case]
    argv = _fill(template, tmp_path)
    monkeypatch.chdir(tmp_path)  # a default run directory (runs/...) would appear here
    before = sorted(p.name for p in tmp_path.iterdir())
    code = _run(argv)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and err.endswith("\n"), f"not exactly one line: {err!r}"
    assert message in err, err
    assert "Traceback" not in err and out == ""
    assert nothing_may_start == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing may be created"


@pytest.mark.parametrize("argv, module", [
    (["simulate", "--sites", "2", "--site-netns"], "simulate.sites_sim"),
    (["bench", "sites", "--real", "--shaper", "kernel"], "simulate.bench.sites"),
])
def test_sites_in_namespaces_where_they_cannot_run_is_one_line_and_exit_2(
    argv: list[str], module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    nothing_may_start: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not root here (or no tc): the check that says so, as on a user's laptop.
    reason = "limiting links in the kernel needs root (ip, tc, iptables); run the simulator as root"
    monkeypatch.setattr(f"{module}.kernel_shaping_supported", lambda: reason)
    monkeypatch.chdir(tmp_path)
    code = _run(argv)
    out, err = capsys.readouterr()
    assert out == ""
    assert code == 2, err
    assert err.count("\n") == 1 and reason in err, err
    assert nothing_may_start == [] and list(tmp_path.iterdir()) == []


def test_the_first_word_names_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    _run(["simulate", "--nodes", "0"])
    assert capsys.readouterr().err.startswith("edgegrove simulate: --nodes 0")
    _run(["broker", "--port", "99999"])
    assert capsys.readouterr().err.startswith("edgegrove broker: argument --port")


@pytest.mark.parametrize("argv", [
    ["agent", "--id", "0", "--broker", "http://127.0.0.1:1883"],
    ["simulate", "--rounds", "-3", "--no-dashboard"],
    ["broker", "--port", "99999"],
])
def test_the_real_entry_point_exits_2_with_one_line(argv: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "edgegrove.cli", *argv], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


def test_rounds_0_means_until_stopped_for_an_agent_and_says_so() -> None:
    from agent.config import AgentConfig

    assert "0 = train until stopped" in str(AgentConfig.model_fields["rounds"].description)
    assert AgentConfig.model_validate({"id": 0, "rounds": 0}).rounds == 0


def test_the_default_run_directory_is_checked_too(
    capsys: pytest.CaptureFixture[str], nothing_may_start: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir("/proc")  # runs/<time> cannot be created here, even by root
    assert _run(["simulate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgegrove simulate: --out runs") and err.count("\n") == 1
    assert nothing_may_start == []
