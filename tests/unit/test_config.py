"""Agent configuration: what is refused, with a message that says what to do."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.config import AgentConfig


def test_a_decaying_lr_schedule_needs_a_known_number_of_rounds() -> None:
    with pytest.raises(ValidationError, match="set rounds > 0"):
        AgentConfig(id=0, lr_schedule="linear")
    config = AgentConfig(id=0, lr_schedule="linear", rounds=100, lr_final=0.5)
    assert config.lr_schedule == "linear" and config.lr_final == 0.5


@pytest.mark.parametrize("bad", [{"lr_final": 0.0}, {"lr_final": 1.5}, {"lr_schedule": "cosine"}])
def test_bad_schedule_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        AgentConfig(id=0, rounds=10, **bad)  # type: ignore[arg-type]
