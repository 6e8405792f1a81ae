"""From the user's agent configuration (agent/config.py) to the agent core's (agent/core.py)."""

from __future__ import annotations

from agent.config import AgentConfig
from agent.core import CoreConfig
from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.membership import ModelIdentity
from agent.protocol.wire import WIRE_DTYPES, DType, job_hash

STATE_PULL_TIMEOUT = 3.0  # a peer silent this long during a state transfer: ask the next one


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
    )


def core_config(config: AgentConfig, state_size: int, model: ModelIdentity | None = None,
                labels: tuple[int, ...] = ()) -> CoreConfig:
    model = model or ModelIdentity()
    return CoreConfig(
        node=config.id, job=config.job, arity=config.arity, rounds=config.rounds,
        allreduce=allreduce_config(config, model.fingerprint), state_size=state_size,
        model=model, labels=labels,
        expected_members=config.expected_members, join_grace=config.join_grace,
        lr=config.lr, lr_schedule=config.lr_schedule, lr_final=config.lr_final,
        eval_every=config.eval_every, adapt_chunks=config.adapt_chunks,
        adapt_broadcast=config.adapt_broadcast,
        checkpoint_every=config.checkpoint_every if config.checkpoint_dir is not None else 0,
        state_pull_timeout=STATE_PULL_TIMEOUT,
        # Long enough for a healthy node to see a report about itself and answer it.
        suspicion_grace=2 * (config.timeout if config.timeout_mode == "fixed" else config.min_timeout),
        # Long enough for a peer whose last round ran to its deadline to fetch our state.
        linger=config.round_deadline + 1.0 + 3 * config.timeout,
    )
