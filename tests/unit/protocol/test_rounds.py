"""The algorithm is an enum (agent/protocol/allreduce.py's ``Algorithm``) and each has its round
machine and its rules (agent/protocol/rounds.py): no name compared as a free string."""

from __future__ import annotations

import json

import pytest

from agent.protocol.allreduce import ALGORITHMS, Algorithm, AllreduceConfig
from agent.protocol.rounds import (
    MACHINES,
    indispensable,
    root_finishes_first,
    server_holds_the_state,
)


def test_every_algorithm_has_its_round_machine() -> None:
    assert set(MACHINES) == set(Algorithm)
    assert ALGORITHMS == ("ft-tree", "tree", "rps", "ps-sync", "ps-async", "ring")


def test_a_configured_name_is_taken_as_its_algorithm_and_an_unknown_one_refused() -> None:
    config = AllreduceConfig(algorithm="ring")  # type: ignore[arg-type]  # as a name from a file
    assert config.algorithm is Algorithm.RING
    assert json.dumps({"algorithm": config.algorithm}) == '{"algorithm": "ring"}'  # telemetry: the name
    with pytest.raises(ValueError, match=r"algorithm must be one of .*, got 'hypercube'"):
        AllreduceConfig(algorithm="hypercube")  # type: ignore[arg-type]


def test_whom_a_round_cannot_do_without_and_where_its_result_and_state_are() -> None:
    assert indispensable(Algorithm.RING, [0, 1, 2], 0) == {0, 1, 2}
    assert indispensable(Algorithm.FT_TREE, [0, 1, 2], 0) == {0}
    assert {a for a in Algorithm if root_finishes_first(a)} == {Algorithm.FT_TREE, Algorithm.TREE}
    assert {a for a in Algorithm if server_holds_the_state(a)} == {Algorithm.PS_ASYNC}
