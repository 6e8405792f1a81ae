"""The agent core's configuration from the agent's options (agent/config.py, the command
line's): the runtime's side of the boundary, so the core (agent/core/) never imports them."""

from __future__ import annotations

import json
from pathlib import Path

from agent.config import AgentConfig, ConfigError
from agent.core.config import CoreConfig, build_core_config
from agent.protocol.allreduce import Algorithm, AllreduceConfig
from agent.protocol.keys import MemberKeys, key_bytes, public_of, ring_of
from agent.protocol.membership import ModelIdentity
from agent.protocol.sync_period import AUTO_START
from agent.protocol.wire import WIRE_DTYPES, DType, job_hash


def allreduce_config(config: AgentConfig, fingerprint: str = "") -> AllreduceConfig:
    # The model's fingerprint is part of the frames' job: another model's frames are foreign.
    return AllreduceConfig(
        job=job_hash(config.job, fingerprint), algorithm=Algorithm(config.algorithm), chunk_size=config.chunk_size,
        # auto: each frame's format from its link, float32 at the widest
        wire_dtype=WIRE_DTYPES.get(config.wire_dtype, DType.F32), wire_auto=config.wire_dtype == "auto",
        wire_budget=config.wire_budget, timeout_mode=config.timeout_mode,
        fixed_timeout=config.timeout, min_timeout=config.min_timeout,
        max_timeout=config.max_timeout, initial_timeout=config.timeout,
        round_deadline=config.round_deadline, remember_dead_links=config.remember_dead_links,
        link_rate_floor=config.link_rate_floor, broadcast=config.broadcast,
        influence_factor=config.influence_bound, audit_units=config.audit_units, straggler_deadline=config.straggler_deadline,
    )


def core_config(config: AgentConfig, state_size: int, model: ModelIdentity | None = None,
                labels: tuple[int, ...] = (), keys: MemberKeys | None = None) -> CoreConfig:
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
        keys=keys,
    )


def member_keys(config: AgentConfig) -> MemberKeys | None:
    """The agent's device key and the job's ring from its options (None: the fleet runs without
    signatures); ConfigError, one line, when they are given but unusable."""
    if config.device_key is None and config.member_keys is None:
        return None
    if config.device_key is None or config.member_keys is None:
        raise ConfigError("device-key and member-keys go together (make-credentials writes both)")
    private = key_bytes(config.device_key)
    if private is None:
        private = key_bytes(_read(Path(config.device_key), "device-key"))
    if private is None:
        raise ConfigError("device-key is not a base64 Ed25519 private key (32 bytes), nor a file holding one")
    try:
        table = json.loads(_read(config.member_keys, "member-keys"))
        ring = ring_of(table.get("member_keys", table) if isinstance(table, dict) else {})
    except ValueError as exc:
        raise ConfigError(f"member-keys {config.member_keys}: {str(exc)[:200]}") from None
    if ring.get(config.id) != public_of(private):
        raise ConfigError(f"member-keys {config.member_keys} does not hold node {config.id}'s device key")
    return MemberKeys.of_private(config.id, private, ring)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {str(path)[:100]} cannot be read: {exc}") from None
