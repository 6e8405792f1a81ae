"""Checkpoints: a damaged or implausible file is set aside with one warning, never loaded."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent import checkpoint
from agent.checkpoint import Checkpoint, Plausible

SIZE = 96
META: dict[str, str | int | float] = {"job": "ckpt", "node": 3}


def _good(round_: int = 40, state: np.ndarray | None = None, epoch: int = 2,
          meta: dict[str, str | int | float] | None = None) -> Checkpoint:
    values = np.linspace(-1, 1, SIZE, dtype=np.float32) if state is None else state
    return Checkpoint(round=round_, epoch=epoch, state=values, meta=dict(META if meta is None else meta))


def _same(a: Checkpoint, b: Checkpoint) -> bool:
    return (a.round, a.epoch, a.meta, a.state.tobytes()) == (b.round, b.epoch, b.meta, b.state.tobytes())


def _aside(directory: Path) -> list[Path]:
    return sorted(directory.glob("checkpoint.npz.corrupt-*"))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_good_checkpoint_round_trips(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    checkpoint.save(tmp_path, _good())
    loaded = checkpoint.load(tmp_path, expect=Plausible(state_size=SIZE, max_round=100,
                                                        job="ckpt", node=3))
    assert loaded is not None and _same(loaded, _good())
    assert checkpoint.load(tmp_path) is not None  # the default limits accept it too
    assert _aside(tmp_path) == [] and _warnings(caplog) == []


def test_no_checkpoint_is_none_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert checkpoint.load(tmp_path) is None
    assert _warnings(caplog) == []


def _truncate(keep: float) -> Callable[[bytes], bytes]:
    return lambda data: data[: int(len(data) * keep)]


def _flip(fraction: float) -> Callable[[bytes], bytes]:
    def flip(data: bytes) -> bytes:
        at = int(len(data) * fraction)
        return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]
    return flip


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda data: b"",
    "truncated-to-10-bytes": lambda data: data[:10],
    "truncated-half": _truncate(0.5),
    "truncated-last-byte": lambda data: data[:-1],
    "bit-flip-in-state": _flip(0.3),
    "bit-flip-in-central-directory": _flip(0.95),
    "not-a-zip": lambda data: b"hello, I am not a checkpoint\n" * 20,
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_file_is_set_aside_with_one_warning(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = checkpoint.save(tmp_path, _good())
    path.write_bytes(DAMAGE[kind](path.read_bytes()))
    damaged = path.read_bytes()
    assert checkpoint.load(tmp_path) is None
    assert not path.exists()
    [aside] = _aside(tmp_path)
    assert aside.read_bytes() == damaged, "the file is kept as it was, for a post-mortem"
    [warning] = _warnings(caplog)
    assert "unreadable" in warning and aside.name in warning and "\n" not in warning
    checkpoint.save(tmp_path, _good(round_=45))  # the directory is usable again
    again = checkpoint.load(tmp_path)
    assert again is not None and again.round == 45


def test_every_single_bit_flip_is_caught_or_harmless(tmp_path: Path) -> None:
    """CRC-32 catches every single-bit error in the data; a flip outside it (a zip time
    stamp) may load, but then exactly the checkpoint that was written."""
    original = _good()
    data = checkpoint.save(tmp_path, original).read_bytes()
    values = data.find(original.state.tobytes())
    assert values > 0
    caught: set[int] = set()
    for at in range(len(data)):
        for f in tmp_path.iterdir():
            f.unlink()
        (tmp_path / "checkpoint.npz").write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
        got = checkpoint.load(tmp_path)
        if got is None:
            caught.add(at)
        else:
            assert _same(got, original), f"a flip at byte {at} changed what was loaded"
    assert set(range(values, values + original.state.nbytes)) <= caught
    assert len(caught) > len(data) // 2


IMPLAUSIBLE: dict[str, tuple[Checkpoint, Plausible, str]] = {
    "round-10^12": (_good(round_=10**12), Plausible(), "round 1000000000000"),
    "negative-round": (_good(round_=-1), Plausible(), "round -1"),
    "round-past-the-budget": (_good(round_=501), Plausible(max_round=500), "outside 0..500"),
    "epoch-2^60": (_good(epoch=2**60), Plausible(), "epoch"),
    "nan-parameters": (_good(state=np.full(SIZE, np.nan, np.float32)), Plausible(), "NaN or infinite"),
    "one-inf": (_good(state=np.r_[np.zeros(SIZE - 1, np.float32), np.float32(np.inf)]),
                Plausible(), "1 of 96"),
    "wrong-size": (_good(), Plausible(state_size=SIZE * 3), "need 288"),
    "empty-state": (_good(state=np.zeros(0, np.float32)), Plausible(), "non-empty"),
    "two-dimensional": (_good(state=np.zeros((8, 12), np.float32)), Plausible(), "flat"),
    "other-job": (_good(), Plausible(job="other"), "job 'ckpt'"),
    "other-node": (_good(), Plausible(node=4), "node 3"),
}


@pytest.mark.parametrize("kind", sorted(IMPLAUSIBLE))
def test_an_implausible_checkpoint_is_set_aside(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved, expect, reason = IMPLAUSIBLE[kind]
    checkpoint.save(tmp_path, saved)
    assert checkpoint.load(tmp_path, expect=expect) is None
    assert len(_aside(tmp_path)) == 1 and not (tmp_path / "checkpoint.npz").exists()
    [warning] = _warnings(caplog)
    assert "implausible" in warning and reason in warning


def test_the_problem_function_names_what_is_wrong() -> None:
    assert checkpoint.problem(_good(), Plausible(state_size=SIZE)) is None
    assert checkpoint.problem(_good(round_=10**12), Plausible()) is not None
    assert checkpoint.problem(_good(round_=10**9), Plausible()) is None  # the default limit itself


def test_two_corrupt_files_in_one_second_keep_both(tmp_path: Path) -> None:
    for _ in range(2):
        (tmp_path / "checkpoint.npz").write_bytes(b"")
        assert checkpoint.load(tmp_path) is None
    assert len(_aside(tmp_path)) == 2


def test_a_checkpoint_that_cannot_be_renamed_still_loads_as_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "checkpoint.npz").write_bytes(b"\x00" * 7)

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(Path, "rename", refuse)
    assert checkpoint.load(tmp_path) is None
    [warning] = _warnings(caplog)
    assert "could not set it aside" in warning


def _ckpt(round_: int) -> Checkpoint:
    return Checkpoint(round=round_, epoch=1, state=np.full(8, round_, np.float32), meta={"job": "j", "node": 0})


def test_the_background_writer_writes_the_newest_and_close_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release, writing = threading.Event(), threading.Event()
    real_save = checkpoint.save
    rounds: list[int] = []

    def slow_save(directory: Path, ckpt: Checkpoint) -> Path:
        writing.set()
        release.wait(5)
        rounds.append(ckpt.round)
        return real_save(directory, ckpt)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    writer = checkpoint.BackgroundWriter(tmp_path)
    writer.submit(_ckpt(20))
    assert writing.wait(5)  # round 20 is being written (an SD card's fsync): we go on
    for r in (40, 60, 80):
        writer.submit(_ckpt(r))
    release.set()
    writer.close()
    assert rounds == [20, 80]  # 40 and 60 were overtaken while they waited
    saved = checkpoint.load(tmp_path)
    assert saved is not None and saved.round == 80 and writer.written == 2


def test_a_checkpoint_that_cannot_be_written_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    writer = checkpoint.BackgroundWriter(blocker / "sub")  # mkdir under a file fails
    writer.submit(_ckpt(5))
    writer.close()
    assert writer.failed == 1 and writer.written == 0


def test_the_age_of_a_checkpoint_is_its_time_on_disk(tmp_path: Path) -> None:
    assert checkpoint.age(tmp_path, 1e9) == 0.0  # none written
    path = checkpoint.save(tmp_path, _good())
    written = path.stat().st_mtime
    assert checkpoint.age(tmp_path, written + 42.5) == pytest.approx(42.5)
    assert checkpoint.age(tmp_path, written - 100.0) == 0.0  # a clock set back since
