"""`edgegrove dashboard` argument handling (the server itself runs in the integration tests)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dashboard import cli
from edgegrove.cli import main


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_bind_loopback_and_disable_controls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cli.TOKEN_ENV, raising=False)
    settings = cli.settings_from_args(parse())
    assert settings.host == "127.0.0.1"
    assert settings.controls_enabled is False
    assert settings.broker_url == "mqtt://127.0.0.1:1883"


def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.TOKEN_ENV, "from-the-environment")
    assert cli.settings_from_args(parse()).control_token == "from-the-environment"
    assert cli.settings_from_args(parse("--control-token", "from-the-flag")).control_token == "from-the-flag"


def test_credentials_file_formats(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("dash:pw:with:colons\n")
    assert cli.read_credentials(plain) == ("dash", "pw:with:colons")
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"username": "u", "password": "p"}))
    assert cli.read_credentials(single) == ("u", "p")
    job = tmp_path / "credentials.json"
    job.write_text(json.dumps({"job": "j", "agents": {},
                               "dashboard": {"username": "dashboard", "password": "d"},
                               "dashboard_control": {"username": "dashboard-control", "password": "c"},
                               "admin": {"username": "admin", "password": "a"}}))
    assert cli.read_credentials(job) == ("dashboard", "d")
    assert cli.read_credentials(job, "admin") == ("admin", "a")
    # With fault controls: the user that may also publish on control, never the admin.
    settings = cli.settings_from_args(parse("--credentials", str(job), "--control-token", "t" * 12))
    assert (settings.username, settings.password) == ("dashboard-control", "c")


@pytest.mark.parametrize("content, message", [
    ("no separator", "USER:PASSWORD"),
    ('{"user": 1}', "username"),
    ("{broken json", "username"),
])
def test_bad_credentials_say_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "creds"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        cli.read_credentials(path)


def test_bad_input_exits_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--broker", "http://nope", "--port", "0"]) == 2
    assert "mqtt://HOST:PORT" in capsys.readouterr().err
    assert main(["dashboard", "--credentials", str(tmp_path / "missing")]) == 2
    assert "cannot read the credentials file" in capsys.readouterr().err
    assert main(["dashboard", "--control-token", "short"]) == 2
    assert "8 characters" in capsys.readouterr().err
    assert main(["dashboard", "--ca-file", str(tmp_path / "missing.crt"), "--broker", "mqtts://h:8883"]) == 2
    assert "--ca-file" in capsys.readouterr().err
    ca = tmp_path / "ca.crt"
    ca.write_text("not checked here")
    assert main(["dashboard", "--ca-file", str(ca), "--broker", "mqtt://h:1883"]) == 2
    assert "mqtts://" in capsys.readouterr().err


def test_a_ca_file_goes_to_the_settings_of_an_mqtts_broker(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----")
    settings = cli.settings_from_args(parse("--broker", "mqtts://h:8883", "--ca-file", str(ca)))
    assert settings.ca_file == ca and settings.broker_url == "mqtts://h:8883"


def test_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["dashboard", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--broker", "--job", "--username", "--password", "--credentials", "--host",
                   "--port", "--control-token", "--event-log", "--url-file"):
        assert option in text


def test_replay_and_websocket_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text('{"t": 0.0, "type": "run", "phase": "start"}\n')
    settings = cli.settings_from_args(parse("--replay", str(run_dir), "--control-token", "t" * 12,
                                            "--allow-origin", "https://ops.example.org",
                                            "--max-websockets", "4"))
    assert settings.replay == run_dir
    assert settings.control_token is None  # a finished run takes no commands
    assert (settings.allowed_origins, settings.max_websockets) == (("https://ops.example.org",), 4)
    assert main(["dashboard", "--replay", str(tmp_path / "nowhere")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["dashboard", "--replay", str(tmp_path)]) == 2
    assert "no events.jsonl" in capsys.readouterr().err
    assert main(["dashboard", "--allow-origin", "ops.example.org"]) == 2
    assert "http(s)://HOST[:PORT]" in capsys.readouterr().err
    assert main(["dashboard", "--max-websockets", "0"]) == 2
    assert "--max-websockets" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_one_line_and_exit_2(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--port", port]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0-65535" in err and "Traceback" not in err


def test_the_port_range_admits_0_and_65535() -> None:
    assert cli.settings_from_args(parse("--port", "0")).port == 0
    assert cli.settings_from_args(parse("--port", "65535")).port == 65535


@pytest.mark.parametrize("content", ["", "garbage\n\x00\x01 not json\n", '[1, 2]\n{"no": "time"}\n'])
def test_a_run_whose_events_are_garbage_is_one_line_and_exit_2(
        tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "events.jsonl").write_text(content)
    assert main(["dashboard", "--replay", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no simulator record" in err and "Traceback" not in err


def test_an_unreadable_events_file_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "events.jsonl").mkdir()  # there, but not a file that can be read
    assert main(["dashboard", "--replay", str(tmp_path)]) == 2
    assert "events.jsonl" in capsys.readouterr().err


def test_allow_host_is_repeatable() -> None:
    settings = cli.settings_from_args(parse("--allow-host", "fleet.example.org", "--allow-host", "ops"))
    assert settings.allowed_hosts == ("fleet.example.org", "ops")


def test_the_url_is_announced_only_once_the_server_answers(tmp_path: Path) -> None:
    import socket
    import threading

    from dashboard.server import bind_socket, make_server
    from dashboard.settings import DashboardSettings

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    answered: list[int] = []

    def announce() -> None:  # the URL must work at the moment it is printed (on the server's loop)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            answered.append(int(server.started))
        server.should_exit = True

    server = make_server(DashboardSettings(port=port), on_started=announce)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    thread.join(30)
    assert answered == [1]


def test_run_dir_for_agent_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = cli.settings_from_args(parse("--run-dir", str(tmp_path)))
    assert settings.run_dir == tmp_path and settings.logs_run_dir == tmp_path
    replay = tmp_path / "run"
    replay.mkdir()
    (replay / "events.jsonl").write_text('{"t": 0.0, "type": "run", "phase": "start"}\n')
    assert cli.settings_from_args(parse("--replay", str(replay))).logs_run_dir == replay
    assert main(["dashboard", "--run-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "--run-dir" in err and "no such directory" in err and len(err.strip().splitlines()) == 1


def test_the_url_file_appears_only_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test waits for the file to exist, then reads it: it must never exist empty or half
    written (it did once beside a busy fleet), so it is renamed into place once written."""
    target = tmp_path / "url"
    seen: list[tuple[bool, str]] = []
    real_replace = cli.os.replace

    def replace(src: str, dst: Path) -> None:
        seen.append((Path(dst).exists(), Path(src).read_text(encoding="utf-8")))
        real_replace(src, dst)

    monkeypatch.setattr(cli.os, "replace", replace)
    cli.write_url_file(target, "http://127.0.0.1:8080/")
    assert seen == [(False, "http://127.0.0.1:8080/\n")]
    assert target.read_text(encoding="utf-8") == "http://127.0.0.1:8080/\n"
    assert [p.name for p in tmp_path.iterdir()] == ["url"]  # no temp file left beside it


def test_accounts_enable_controls_and_a_bad_file_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(cli.TOKEN_ENV, raising=False)
    accounts = tmp_path / "accounts.json"
    monkeypatch.setenv("EDGEGROVE_ACCOUNT_PASSWORD", "ana-password")
    assert main(["accounts", "add", "ana", "--role", "operator", "--file", str(accounts)]) == 0
    assert main(["accounts", "list", "--file", str(accounts)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ana\toperator"
    settings = cli.settings_from_args(parse("--accounts", str(accounts)))
    assert settings.accounts_file == accounts and settings.controls_enabled
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps({"dashboard": {"username": "d", "password": "p"},
                                 "dashboard_control": {"username": "c", "password": "r"},
                                 "admin": {"username": "a", "password": "q"}}))
    # Controls on: the control account (reads and the job's control topic), never the admin.
    assert cli.settings_from_args(parse("--accounts", str(accounts), "--credentials", str(creds))).username == "c"
    accounts.write_text('{"accounts": [{"name": "ana", "role": "root", "password": "scrypt$x"}]}')
    assert main(["dashboard", "--accounts", str(accounts), "--port", "0"]) == 2
    assert "role 'root'" in capsys.readouterr().err
    assert main(["accounts", "remove", "bob", "--file", str(accounts)]) == 2
    assert main(["dashboard", "--accounts", str(tmp_path / "missing.json"), "--port", "0"]) == 2
    assert "cannot read the accounts file" in capsys.readouterr().err
