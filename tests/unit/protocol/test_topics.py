"""Topic names of a job: building, parsing, and refusing what is not ours."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.protocol.topics import MAX_NODE_ID, Topics, validate_job

TOPICS = Topics("mnist-7")
node_ids = st.integers(0, MAX_NODE_ID)


def test_default_prefix_and_every_topic() -> None:
    assert TOPICS.prefix == "edgegrove/mnist-7"
    assert TOPICS.link(3, 1) == "edgegrove/mnist-7/link/3/1"
    assert TOPICS.links_to(1) == "edgegrove/mnist-7/link/+/1"
    assert TOPICS.status(4) == "edgegrove/mnist-7/status/4"
    assert TOPICS.all_status() == "edgegrove/mnist-7/status/+"
    assert TOPICS.view == "edgegrove/mnist-7/view"  # older versions' job-wide view
    assert TOPICS.view_of(0) == "edgegrove/mnist-7/view/0"
    assert TOPICS.all_views() == "edgegrove/mnist-7/view/+"
    assert TOPICS.parse_view("edgegrove/mnist-7/view/12") == 12
    assert TOPICS.parse_view(TOPICS.view) is None and TOPICS.is_view(TOPICS.view)
    assert TOPICS.suspect(3) == "edgegrove/mnist-7/suspect/3" and TOPICS.parse_suspect(TOPICS.suspect(3)) == 3
    assert TOPICS.telemetry(2) == "edgegrove/mnist-7/telemetry/2"
    assert TOPICS.all_telemetry() == "edgegrove/mnist-7/telemetry/+"
    assert TOPICS.control == "edgegrove/mnist-7/control"
    assert TOPICS.fanout(5) == "edgegrove/mnist-7/fanout/5"
    assert TOPICS.all_fanout() == "edgegrove/mnist-7/fanout/+"
    assert Topics("j", prefix="site/a/j").link(0, 1) == "site/a/j/link/0/1"


@given(node_ids, node_ids)
def test_parse_inverts_build(src: int, dst: int) -> None:
    assert TOPICS.parse_link(TOPICS.link(src, dst)) == (src, dst)
    assert TOPICS.parse_status(TOPICS.status(src)) == src
    assert TOPICS.parse_telemetry(TOPICS.telemetry(dst)) == dst
    assert TOPICS.parse_fanout(TOPICS.fanout(src)) == src
    assert TOPICS.parse_fanout(TOPICS.link(src, dst)) is None
    assert TOPICS.parse_link(TOPICS.fanout(src)) is None
    # A topic of one kind is not another kind.
    assert TOPICS.parse_status(TOPICS.link(src, dst)) is None
    assert TOPICS.parse_link(TOPICS.telemetry(dst)) is None


@pytest.mark.parametrize("topic", [
    "edgegrove/other-job/link/1/2",  # a foreign job
    "edgegrove/mnist-70/link/1/2",  # a job whose name merely starts like ours
    "elsewhere/link/1/2",
    "edgegrove/mnist-7/link/1",
    "edgegrove/mnist-7/link/1/2/3",
    "edgegrove/mnist-7/link/1/",
    "edgegrove/mnist-7/link//2",
    "edgegrove/mnist-7/link/+/2",
    "edgegrove/mnist-7/link/#",
    "edgegrove/mnist-7/link/-1/2",
    "edgegrove/mnist-7/link/1024/2",  # beyond the id range
    "edgegrove/mnist-7/link/99999999999999999999/2",
    "edgegrove/mnist-7/link/007/2",  # not canonical: agent 7's ACL is on link/7/+
    "edgegrove/mnist-7/link/ 1/2",
    "edgegrove/mnist-7/link/0x1/2",
    "edgegrove/mnist-7/link/1.0/2",
    "edgegrove/mnist-7/link/²/1",  # str.isdigit() says yes, int() says no
    "edgegrove/mnist-7/link/١/2",  # Arabic-Indic digit one
    "",
])
def test_foreign_and_absurd_link_topics_are_refused(topic: str) -> None:
    assert TOPICS.parse_link(topic) is None


@pytest.mark.parametrize("topic", [
    "edgegrove/mnist-7/status/", "edgegrove/mnist-7/status/abc", "edgegrove/mnist-7/status/5000",
    "edgegrove/mnist-7/status/1/2", "edgegrove/other/status/1",
])
def test_bad_status_and_telemetry_topics_are_refused(topic: str) -> None:
    assert TOPICS.parse_status(topic) is None
    assert TOPICS.parse_telemetry(topic.replace("status", "telemetry")) is None
    assert TOPICS.parse_fanout(topic.replace("status", "fanout")) is None


@given(st.text(max_size=60))
def test_parsing_any_text_never_raises(topic: str) -> None:
    for parse in (TOPICS.parse_link, TOPICS.parse_status, TOPICS.parse_telemetry):
        result = parse(TOPICS.prefix + "/link/" + topic)
        assert result is None or isinstance(result, (int, tuple))
        parse(topic)


@pytest.mark.parametrize("job", ["", "a/b", "a+b", "#", "x" * 65, "job\n", "jöb", "a b"])
def test_invalid_job_names_get_a_message(job: str) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        validate_job(job)
    with pytest.raises(ValueError):
        Topics(job)


@pytest.mark.parametrize("prefix", ["site/+/x", "site/#", "site/"])
def test_invalid_prefixes_get_a_message(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        Topics("job", prefix=prefix)


def test_valid_job_names_pass() -> None:
    for job in ("a", "mnist-7", "run_2024.11", "x" * 64):
        assert validate_job(job) == job
