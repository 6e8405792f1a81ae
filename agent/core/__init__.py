"""The agent core (sans-IO): see agent_core.py for its map. What drivers and tests use is
here: ``from agent.core import AgentCore, CoreConfig, Publish, ...``."""

from agent.core.actions import (
    AnnounceState,
    ApplyControl,
    ApplyUpdate,
    Channel,
    ComputeGradient,
    CoreAction,
    Displaced,
    FleetFinished,
    LoadState,
    Publish,
    ReportRound,
    SaveCheckpoint,
    SendState,
)
from agent.core.agent_core import AgentCore
from agent.core.config import CoreConfig
from agent.core.events import CoreEvent
from agent.core.progress import Phase
from agent.core.report import Counters, RoundReport, telemetry_for

__all__ = [
    "AgentCore", "AnnounceState", "ApplyControl", "ApplyUpdate", "Channel", "ComputeGradient", "CoreAction",
    "CoreConfig", "CoreEvent", "Counters", "Displaced", "FleetFinished", "LoadState", "Phase", "Publish",
    "ReportRound", "RoundReport", "SaveCheckpoint", "SendState", "telemetry_for",
]
