"""The one builder of the agent core's configuration (agent/core.py): from the allreduce's
configuration and the run's facts, with the values derived from its timeouts decided here.
The agent builds it from the user's configuration (agent/config.py); the in-memory fleet
(simulate/virtual_fleet.py) builds it here too, passing what it runs differently explicitly."""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict, Unpack

from agent.config import AgentConfig
from agent.core import CoreConfig
from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.membership import ModelIdentity
from agent.protocol.sync_period import AUTO_START, PeriodRule
from agent.protocol.wire import WIRE_DTYPES, DType, job_hash

STATE_PULL_TIMEOUT = 3.0  # a peer silent this long during a state transfer: ask the next one


class CoreOverrides(TypedDict, total=False):
    """The fields of ``CoreConfig`` a driver sets beyond the run's facts."""

    expected_members: int
    join_grace: float
    lr: float
    lr_schedule: str
    lr_final: float
    eval_every: int
    checkpoint_every: int
    state_pull_timeout: float
    suspicion_grace: float
    reconnect_hold: float
    offline_settle: float
    linger: float
    state_chunk_values: int
    adapt_chunks: bool
    adapt_broadcast: bool
    model: ModelIdentity
    labels: tuple[int, ...]
    sync_every: int | None
    sync_auto: PeriodRule | None
    site: str


def allreduce_config(config: AgentConfig, fingerprint: str = "") -> AllreduceConfig:
    # The model's fingerprint is part of the frames' job: another model's frames are foreign.
    return AllreduceConfig(
        job=job_hash(config.job, fingerprint), algorithm=config.algorithm, chunk_size=config.chunk_size,
        # auto: each frame's format from its link, float32 at the widest
        wire_dtype=WIRE_DTYPES.get(config.wire_dtype, DType.F32), wire_auto=config.wire_dtype == "auto",
        wire_budget=config.wire_budget, timeout_mode=config.timeout_mode,
        fixed_timeout=config.timeout, min_timeout=config.min_timeout,
        max_timeout=config.max_timeout, initial_timeout=config.timeout,
        round_deadline=config.round_deadline, remember_dead_links=config.remember_dead_links,
        link_rate_floor=config.link_rate_floor, broadcast=config.broadcast,
        influence_factor=config.influence_bound, straggler_deadline=config.straggler_deadline,
    )


def build_core_config(node: int, allreduce: AllreduceConfig, *, job: str, arity: int, rounds: int,
                      state_size: int, **overrides: Unpack[CoreOverrides]) -> CoreConfig:
    """The core's configuration for ``node``; ``overrides`` replace any field by name."""
    base_timeout = allreduce.fixed_timeout if allreduce.timeout_mode == "fixed" else allreduce.min_timeout
    config = CoreConfig(
        node=node, job=job, arity=arity, rounds=rounds, allreduce=allreduce, state_size=state_size,
        state_pull_timeout=STATE_PULL_TIMEOUT,
        # Long enough for a healthy node to see a report about itself and answer it.
        suspicion_grace=2 * base_timeout,
        # Long enough for a peer whose last round ran to its deadline to fetch our state.
        linger=allreduce.round_deadline + 1.0 + 3 * allreduce.fixed_timeout,
    )
    return replace(config, **overrides)


def core_config(config: AgentConfig, state_size: int, model: ModelIdentity | None = None,
                labels: tuple[int, ...] = ()) -> CoreConfig:
    model = model or ModelIdentity()
    return build_core_config(
        config.id, allreduce_config(config, model.fingerprint), job=config.job, arity=config.arity,
        rounds=config.rounds, state_size=state_size, model=model, labels=labels, site=config.site,
        expected_members=config.expected_members, join_grace=config.join_grace,
        lr=config.lr, lr_schedule=config.lr_schedule, lr_final=config.lr_final,
        eval_every=config.eval_every, adapt_chunks=config.adapt_chunks,
        adapt_broadcast=config.adapt_broadcast,
        sync_every=AUTO_START if config.sync_every == "auto" else config.sync_every, sync_auto=config.period_rule,
        checkpoint_every=config.checkpoint_every if config.checkpoint_dir is not None else 0,
    )
