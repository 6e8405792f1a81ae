"""The agent core's configuration and its one builder: from the allreduce's configuration and
the run's facts, with the values derived from its timeouts decided here. The runtime builds it
from the user's options (agent/runtime_config.py); the in-memory fleet
(simulate/virtual_fleet.py) builds it here too, passing what it runs differently explicitly.
The core never sees the command line's ``AgentConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypedDict, Unpack

from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.keys import MemberKeys
from agent.protocol.membership import ModelIdentity
from agent.protocol.state_transfer import STATE_CHUNK_VALUES
from agent.protocol.sync_period import PeriodRule

STATE_PULL_TIMEOUT = 3.0  # a peer silent this long during a state transfer: ask the next one


@dataclass(frozen=True)
class CoreConfig:
    node: int
    job: str = "default"
    arity: int = 2
    rounds: int = 0  # 0: until stopped
    allreduce: AllreduceConfig = field(default_factory=AllreduceConfig)
    state_size: int | None = None  # length of the training state (params + optimizer)
    expected_members: int = 0
    join_grace: float = 0.0
    lr: float = 0.001
    lr_schedule: str = "constant"
    lr_final: float = 0.1
    eval_every: int = 0
    checkpoint_every: int = 0  # 0: no checkpoints
    state_pull_timeout: float = 3.0  # a peer silent this long during a state transfer: next one
    suspicion_grace: float = 0.4  # a report about a silent node counts if unrefuted this long
    reconnect_hold: float = 3.0  # after a reconnect, statuses come back for this long: no verdicts
    offline_settle: float = 1.0  # a Will changes views this long after it came (broker shutdowns)
    linger: float = 0.0  # seconds to keep answering after the last round
    state_chunk_values: int = STATE_CHUNK_VALUES
    # As coordinator, cut the vector into smaller chunks for the fleet while our downlink is
    # slow (agent/protocol/chunking.py); off: every round uses allreduce.chunk_size.
    adapt_chunks: bool = True
    adapt_broadcast: bool = True
    model: ModelIdentity = field(default_factory=ModelIdentity)  # announced; the fleet's must match
    labels: tuple[int, ...] = ()  # training samples per label in our shard, announced too
    # Periodic averaging: local optimizer steps per round, the round averaging their model
    # delta (agent/model/periodic.py); None: the round averages one step's gradient.
    sync_every: int | None = None
    # sync-every auto: the coordinator picks the period from the members' timings by this
    # rule and publishes it in the view (agent/protocol/sync_period.py); sync_every is the start.
    sync_auto: PeriodRule | None = None
    site: str = ""  # our site, announced in our status: the coordinator's views place us by it
    # Our device key and the job's ring: control messages signed and checked (None: neither).
    keys: MemberKeys | None = None



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
    keys: MemberKeys | None


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
