"""An in-memory bus for the Figure 13 baselines' round machines: every Send is delivered in
order after a fixed latency on a fake clock; a node may be silent (it neither sends nor gets)."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import AllreduceConfig, RoundContext, RoundMachine, Send
from agent.protocol.ps_ledger import ServerLedger
from agent.protocol.rounds import new_round
from agent.protocol.topology import Tree
from agent.protocol.wire import Frame


class Bus:
    def __init__(self, config: AllreduceConfig, members: tuple[int, ...], latency: float = 0.001,
                 silent: frozenset[int] = frozenset()) -> None:
        self.config, self.tree, self.latency, self.silent = config, Tree(members, 2), latency, silent
        self.now = 0.0
        self.queue: list[tuple[float, int, Frame]] = []
        self.machines: dict[int, RoundMachine] = {}
        self.ledgers = {n: ServerLedger() for n in members}
        self.sent = 0

    def run_round(self, round: int, grads: dict[int, np.ndarray], until: float = 60.0) -> dict[int, RoundMachine]:
        """One round from ``now``: start every live node's machine, deliver and tick until every
        live node has a result (or ``until`` seconds pass: then some have none)."""
        start = self.now
        self.machines = {}
        for node in self.tree.members:
            if node in self.silent:
                continue
            ctx = RoundContext(self.config, self.tree, node, round, grads[node], 0,
                               self.config.new_links(), self.now, ledger=self.ledgers[node])
            self.machines[node] = new_round(ctx)
        for node, machine in self.machines.items():
            self._post(node, machine.start(self.now))
        while any(m.result is None for m in self.machines.values()) and self.now < start + until:
            self._step(start + until)
        return self.machines

    def _step(self, limit: float) -> None:
        timers = [t for m in self.machines.values() if m.result is None and (t := m.next_timer()) is not None]
        wake = min([*(t for t, _, _ in self.queue[:1]), *timers], default=self.now + 1.0)
        self.now = max(self.now, min(wake, limit))
        if self.queue and self.queue[0][0] <= self.now:
            _, dst, frame = self.queue.pop(0)
            if dst in self.machines:
                self._post(dst, self.machines[dst].on_frame(frame, self.now))
        for node, machine in list(self.machines.items()):
            if (t := machine.next_timer()) is not None and t <= self.now:
                self._post(node, machine.on_timer(self.now))

    def _post(self, node: int, actions: list) -> None:  # type: ignore[type-arg]
        for action in actions:
            if isinstance(action, Send):
                self.sent += 1
                if action.dst not in self.silent:
                    self.queue.append((self.now + self.latency, action.dst, action.frame))
        self.queue.sort(key=lambda item: item[0])
