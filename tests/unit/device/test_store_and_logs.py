from __future__ import annotations

import json
import logging
from pathlib import Path

from agent.device.actions import Persist
from agent.device.events import Booted
from agent.device.logs import BURST, LogForwarder
from agent.device.store import STATE_FILE, StateStore
from agent.jobs.document import BlobRef


def test_the_job_in_progress_survives_a_restart(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.booted() == Booted(None)
    store.checkpoints("old").mkdir(parents=True)
    store.persist(Persist(b'{"payload":"x"}', 4, (("old", 1.0),)))
    assert StateStore(tmp_path).booted() == Booted(b'{"payload":"x"}', None, 4, (("old", 1.0),))
    assert not store.checkpoints("old").exists()  # an ended job's checkpoints go


def test_a_damaged_state_file_starts_idle(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("{not json")
    assert StateStore(tmp_path).booted() == Booted(None)


def test_a_stored_blob_is_found_only_with_its_hash(tmp_path: Path) -> None:
    import hashlib

    data = b"model" * 300
    blob = BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data), chunk_size=1024, chunks=2,
                   filename="m.tflite")
    store = StateStore(tmp_path)
    assert not store.has_blob(blob)
    store.store_blob(blob, data)
    assert store.has_blob(blob)
    store.blob_path(blob).write_bytes(b"x" * len(data))
    assert not store.has_blob(blob)


def test_log_lines_are_rate_limited_and_say_what_was_dropped() -> None:
    sent: list[dict[str, object]] = []
    now = [0.0]
    forwarder = LogForwarder("pi", "edgegrove/devices/pi/log",
                             lambda _t, p: sent.append(json.loads(p)), rate=1.0, clock=lambda: now[0])
    logger = logging.getLogger("test.device.logs")
    logger.addHandler(forwarder)
    logger.propagate = False
    try:
        logger.info("not forwarded")
        for i in range(BURST + 3):
            logger.warning("w%d", i)
        assert [s["line"] for s in sent] == [f"w{i}" for i in range(BURST)]
        now[0] = 2.0
        logger.error("after")
        assert sent[-1]["line"] == "after" and sent[-1]["dropped"] == 3 and sent[-1]["level"] == "error"
        assert forwarder.last_error == "after"
    finally:
        logger.removeHandler(forwarder)
