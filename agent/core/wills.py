"""Last Wills and the grace a round gives its root: nobody can average a round without its
root, so when the root's Will comes the round's members wait a moment (``ROOT_WILL_GRACE``)
for it to come back (its connection dropped) before they route around it."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agent.protocol.allreduce import ROOT_WILL_GRACE, Algorithm, RoundMachine


class RootGrace:
    def __init__(self, node: int, algorithm: Algorithm) -> None:
        self.node, self.algorithm = node, algorithm
        self.wills: dict[int, tuple[float, int]] = {}  # peer -> (when, incarnation) of its last Will
        self.rounds: set[int] = set()  # rounds whose root's Will came: waiting for it to come back

    def will_came(self, peer: int, now: float, incarnation: int) -> None:
        self.wills[peer] = (now, incarnation)

    def grants(self, machine: RoundMachine, peer: int) -> bool:
        """``peer`` is the root of ``machine``'s unfinished round (rps has no root to wait for)."""
        return (machine.tree.root == peer != self.node and machine.result is None
                and self.algorithm != Algorithm.RPS)

    def recent_will(self, peer: int, now: float) -> bool:
        will = self.wills.get(peer)
        return will is not None and now < will[0] + ROOT_WILL_GRACE

    def same_life(self, peer: int, incarnation: int) -> bool:
        """The life whose Will came is the one back (its connection dropped, it did not restart)."""
        return self.wills.get(peer, (0.0, -1))[1] == incarnation

    def ends_at(self, machine: RoundMachine) -> float:
        return self.wills[machine.tree.root][0] + ROOT_WILL_GRACE

    def deadlines(self, machines: Mapping[int, RoundMachine]) -> list[float]:
        return [self.ends_at(machines[rnd]) for rnd in self.rounds if rnd in machines]

    def end(self, machines: Mapping[int, RoundMachine],
            ends: Callable[[RoundMachine], bool]) -> list[tuple[int, RoundMachine]]:
        """The rounds waiting for their root for which ``ends`` holds (rounds gone are dropped)."""
        self.rounds &= set(machines)
        done = [(rnd, machines[rnd]) for rnd in sorted(self.rounds) if ends(machines[rnd])]
        self.rounds -= {rnd for rnd, _ in done}
        return done
