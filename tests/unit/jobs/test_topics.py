from __future__ import annotations

import pytest

from agent.jobs import topics

SHA = "ab" * 32


def test_builders_and_parsers_round_trip() -> None:
    assert topics.parse_device_record(topics.device_record("pi-3")) == "pi-3"
    assert topics.parse_device_log(topics.device_log("pi-3")) == "pi-3"
    assert topics.parse_job_spec(topics.job_spec("mnist.1")) == "mnist.1"
    assert topics.parse_job_control(topics.job_control("mnist.1")) == "mnist.1"
    assert topics.parse_job_exec(topics.job_exec("mnist.1", "pi-3")) == ("mnist.1", "pi-3")
    assert topics.parse_job_result(topics.job_result("j")) == "j"
    assert topics.parse_job_result_chunk(topics.job_result_chunk("j", 12)) == ("j", 12)
    assert topics.parse_blob_chunk(topics.blob_chunk(SHA, 3)) == (SHA, 3)


def test_the_layout_is_the_spec() -> None:
    assert topics.device_record("pi") == "edgegrove/devices/pi"
    assert topics.job_exec("j", "pi") == "edgegrove/jobs/j/exec/pi"
    assert topics.blob_chunk(SHA, 0) == f"edgegrove/blobs/{SHA}/0"
    assert topics.all_execs_of("pi") == "edgegrove/jobs/+/exec/pi"


@pytest.mark.parametrize("topic", [
    "edgegrove/devices/Pi", "edgegrove/devices/pi/x", "edgegrove/devices/",
    "edgegrove/jobs/devices/spec", "edgegrove/jobs/j/spec/x", "edgegrove/jobs/j/exec/PI",
    f"edgegrove/blobs/{SHA}/01", "edgegrove/blobs/xyz/0", "other/devices/pi",
])
def test_parsers_refuse_what_is_not_exactly_a_topic(topic: str) -> None:
    assert topics.parse_device_record(topic) is None
    assert topics.parse_job_spec(topic) is None
    assert topics.parse_job_exec(topic) is None
    assert topics.parse_blob_chunk(topic) is None


@pytest.mark.parametrize("name", ["devices", "jobs", "blobs", "a/b", ""])
def test_reserved_or_bad_job_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        topics.job_spec(name)


@pytest.mark.parametrize("name", ["Pi", "-pi", "pi_3", "a" * 64, "pi/3", "+"])
def test_bad_device_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        topics.validate_device(name)


def test_chunk_index_is_bounded() -> None:
    with pytest.raises(ValueError):
        topics.blob_chunk(SHA, -1)
    with pytest.raises(ValueError):
        topics.job_result_chunk("j", topics.MAX_CHUNKS)
