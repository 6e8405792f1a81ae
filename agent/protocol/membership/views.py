"""The views a node took and their checks: newest last, the one applying to each round, those
held until their publisher coordinates, and how far a view's epoch may jump.

Every node uses, in round r, the newest view (highest epoch) whose ``from_round <= r``, so all
members switch trees at the same round; with none, the newest view it has (never waiting for a
view that cannot come).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol.messages import View
from agent.protocol.topology import Tree

MAX_EPOCH_STEP = 4  # a view's epoch is at most this far beyond the newest one known
# ... unless our own Will came after we took the newest view: cut off, we missed the views the
# fleet published meanwhile (one per change: a long cut is many), and its retained view is the
# one way back. Still bounded: an epoch nobody can follow is refused all the same.
MAX_AWAY_EPOCH_STEP = 1024
KEPT_VIEWS = 8


def view_root(view: View) -> int:
    """The root of a view's tree: its coordinator, an established member (never a node that
    is still joining), when it is a member; else the lowest member."""
    return view.coordinator if view.coordinator in view.members else view.members[0]


def view_tree(view: View) -> Tree:
    sites = dict(zip(view.members, view.sites, strict=True)) if view.sites else None
    return Tree.of(view.members, view.arity, root=view_root(view), sites=sites)


@dataclass(frozen=True)
class PublishView:
    view: View


@dataclass(frozen=True)
class Tuning:
    """How a view's rounds run beyond who takes part (the coordinator's picks): values per
    chunk, the broadcast, local steps per round (0 / "": as the agents are configured)."""

    chunk_values: int = 0
    broadcast: str = ""
    sync_every: int = 0

    @classmethod
    def of(cls, view: View | None) -> Tuning:
        return cls() if view is None else cls(view.chunk_values, view.broadcast, view.sync_every)


def _rank(view: View) -> tuple[int, int]:
    """Views order by epoch; of one epoch, the lower coordinator's wins."""
    return view.epoch, -view.coordinator


class ViewBook:
    def __init__(self, initial: View | None = None) -> None:
        self.kept: list[View] = [initial] if initial is not None else []
        self.pending: dict[int, View] = {}  # publisher -> view, until it is the coordinator
        self.removed_at: dict[int, int] = {}  # node -> the order (``seen``) a view we took dropped it
        self.taken_at = -1  # the order (``seen``) we took the newest view at

    @property
    def newest(self) -> View:
        return self.kept[-1]

    @property
    def latest(self) -> View | None:
        return self.kept[-1] if self.kept else None

    def view_for(self, round: int) -> View | None:
        """The newest view applying to ``round``; with none, the newest view there is."""
        usable = [v for v in self.kept if v.from_round <= round]
        if usable:
            return max(usable, key=lambda v: v.epoch)
        return self.newest if self.kept else None

    def members_for(self, round: int) -> tuple[int, ...]:
        view = self.view_for(round)
        return tuple(view.members) if view is not None else ()

    def is_news(self, view: View) -> bool:
        """Newer than every view kept."""
        return not self.kept or _rank(view) > _rank(self.newest)

    def epoch_jumps(self, view: View, away: bool) -> bool:
        """Beyond the steps the fleet can have made since the newest view (many more when we
        were cut off after taking it)."""
        return view.epoch > self.newest.epoch + (MAX_AWAY_EPOCH_STEP if away else MAX_EPOCH_STEP)

    def take(self, view: View, seen: int) -> None:
        """Keep ``view`` (news: ``is_news``), taken as the ``seen``-th thing heard."""
        for node in set(self.newest.members if self.kept else ()) - set(view.members):
            self.removed_at[node] = seen
        self.kept.append(view)
        self.kept = self.kept[-KEPT_VIEWS:]
        self.taken_at = seen

    def yield_own(self, view: View, node: int) -> None:
        """A coordinator taken for silent (overloaded, say) published views of its own while
        the fleet's new coordinator published the same epochs without it; ours win a tie
        (lower id), so we never took theirs and never learnt we were out: two fleets, and we
        never rejoined. Ours (``node``'s) from ``view``'s epoch on are void: the fleet went on
        without us."""
        kept = [v for v in self.kept if not (v.coordinator == node and v.epoch >= view.epoch)]
        if kept and len(kept) < len(self.kept):
            self.kept = kept
