"""Answers proportional to asks (agent/protocol/answer_budget.py): a budget per asker, and
asks padded to pay for their answers."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import frame_size
from agent.protocol.answer_budget import (
    AMPLIFICATION,
    PAD_INDEX,
    AnswerBudget,
    asked_indices,
    padded,
    values_frame_bytes,
)
from agent.protocol.wire import Flag, Frame, Kind, decode, encode


def test_a_budget_answers_at_most_amplification_times_the_bytes_received() -> None:
    budget = AnswerBudget()
    assert not budget.spend(3, 1)  # nothing received: nothing owed
    budget.earn(3, 100)
    assert budget.owed(3) == AMPLIFICATION * 100
    assert budget.spend(3, 250) and not budget.spend(3, 51) and budget.spend(3, 50)
    assert budget.amplification(3) == AMPLIFICATION and budget.owed(4) == 0


def test_a_padded_ask_pays_for_its_answer_and_no_more_than_one_index_over() -> None:
    ask = Frame(Kind.PULL, 1, 2, 3, 0, 4, Flag.BROADCAST).with_indices([1, 3])
    for answer in (0, 10, 1_000, 1_048_576 + 77):
        pad = padded(ask, answer)
        assert AMPLIFICATION * frame_size(pad) >= answer
        assert pad == ask or AMPLIFICATION * (frame_size(pad) - 4) < answer  # the least padding
        assert asked_indices(pad) == [1, 3] and decode(encode(pad)) == pad


def test_padding_alone_asks_for_everything() -> None:
    ask = padded(Frame(Kind.MODEL_PULL, 1, 2, 3), 3_000)
    assert PAD_INDEX in ask.indices() and asked_indices(ask) == []


def test_a_values_frame_is_sized_as_encoded() -> None:
    frame = Frame(Kind.DATA, 1, 2, 3, contributors=frozenset({0, 9})).with_values(np.ones(5, np.float32))
    assert values_frame_bytes(5, 4, 9) == frame_size(frame) == len(encode(frame))
