"""The parts of one agent core, built once from its configuration and wired to each other.

Each part owns its own state (the membership the fleet's picture, the outbox what goes out, the
rounds the machines in flight, ...); ``CoreParts`` only holds them together so that the event
handlers and the steps of the core (agent/core/agent_core.py, steps.py, ...) reach the same
ones. The phase and the round are not here: ``Progress`` (progress.py) owns them.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.chunks import ChunkPolicy
from agent.core.config import CoreConfig
from agent.core.gate import RoundGate
from agent.core.inbox import Inbox
from agent.core.outbox import CoreOutbox
from agent.core.period import PeriodPolicy
from agent.core.report import Counters
from agent.core.rounds import Rounds
from agent.core.state_fetch import StateFetch
from agent.core.state_server import StateServer
from agent.core.suspicion import SuspicionBook
from agent.protocol.chunking import DownlinkRate
from agent.protocol.influence import NormHistory
from agent.protocol.membership import Membership, StartupGate
from agent.protocol.membership.evidence import seal
from agent.protocol.messages import NodeState, Status
from agent.protocol.plausibility import PlausibilityBook
from agent.protocol.ps_ledger import ServerLedger
from agent.protocol.rounds import root_finishes_first, server_holds_the_state
from agent.protocol.topics import Topics


@dataclass
class BrokerLink:
    """Our connection to the broker, as the transport reported it."""

    connected: bool = True
    disconnected_at: float = -1e9


class CoreParts:
    def __init__(self, config: CoreConfig, incarnation: int, pid: int, now: float) -> None:
        self.config = config
        self.node = config.node
        self.incarnation = incarnation
        self.pid = pid
        self.topics = Topics(config.job)
        self.broker = BrokerLink()
        self.links = config.allreduce.new_links()
        self.norms = NormHistory(factor=config.allreduce.influence_factor)
        self.plausibility = PlausibilityBook()  # ft-tree: children that lied, across rounds
        self.ledger = ServerLedger()  # ps-async: what this node, as the server, owes each worker
        self.downlink = DownlinkRate()
        algorithm = config.allreduce.algorithm
        self.membership = Membership(config.node, config.arity, gate=StartupGate(
            config.expected_members, config.join_grace, now), grace=config.suspicion_grace,
            offline_settle=config.offline_settle, identity=config.model,
            root_finishes_first=root_finishes_first(algorithm), keys=config.keys)
        self.counters = Counters()
        self.book = SuspicionBook(config.node, incarnation)
        self.outbox = CoreOutbox(config.node, self.counters, self.book, config.keys)
        self.inbox = Inbox(config.node, config.allreduce.job, self.topics, self.counters, self.downlink, config.keys)
        sole_source = server_holds_the_state(algorithm)
        self.server = StateServer(config.node, config.allreduce.job, config.state_size, config.state_chunk_values,
                                  self.counters.rejected, sole_source=sole_source)
        self.fetch = StateFetch(config.node, config.allreduce.job, self.membership, self.outbox,
                                timeout=config.state_pull_timeout, size=config.state_size,
                                chunk_values=config.state_chunk_values, from_coordinator=sole_source,
                                site=config.site)
        self.chunks = ChunkPolicy(config.allreduce, config.adapt_chunks, config.adapt_broadcast)
        self.period = PeriodPolicy(config.sync_every, config.sync_auto)
        self.rounds = Rounds(config.node, algorithm, self.outbox)
        self.gate = RoundGate(config.node, self.membership, config.allreduce.round_deadline, algorithm)

    def status(self, state: NodeState, round: int) -> Status:
        """Our status as ``state`` at ``round``: who we are, our model, site and timings."""
        model, timing = self.config.model, self.period.announced()
        status = Status(node=self.node, state=state, round=round, pid=self.pid,
                        incarnation=self.incarnation, fingerprint=model.fingerprint, model=model.name,
                        params=model.params, labels=list(self.config.labels),
                        site=self.config.site, step_s=timing.step_s, sync_s=timing.sync_s)
        return status if self.config.keys is None else seal(self.config.keys, status)
