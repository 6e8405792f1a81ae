"""What a status says: whether its state counts as live, whom it speaks for against the topic
it came on, whether it shows its node at the fleet's round, and the sites the statuses name."""

from __future__ import annotations

import enum

from agent.protocol.membership.witnesses import SUSPICION_ROUNDS
from agent.protocol.messages import Status

LIVE_STATES = ("online", "joining")


class StatusSource(enum.Enum):
    """Whom a status speaks for, against the topic it came on (the ACL lets each agent write
    only its own ``status/<id>``, and its Last Will goes there too)."""

    OWN = "own"  # the node its topic names
    FORGED = "forged"  # another node: refused, counted


def status_source(status: Status, topic_node: int) -> StatusSource:
    return StatusSource.OWN if status.node == topic_node else StatusSource.FORGED


def speaks_at(status: Status, round: int) -> bool:
    """The status shows its node here now: joining, or online at about ``round``. Not one from
    far behind: a bridge back from a cut resends its site's retained statuses of the cut's
    round (taken back on those, the site stalled the fleet's next round and split it)."""
    return status.state == "joining" or (status.state == "online" and status.round + SUSPICION_ROUNDS >= round)


def sites_of(sites: dict[int, str], members: list[int]) -> list[str]:
    """Each member's site by its statuses; [] when none has one (a site-blind tree)."""
    named = [sites.get(m, "") for m in members]
    return named if any(named) else []


def cut_off(sites: dict[int, str], own: str, bridge: str) -> list[int]:
    """The nodes a down bridge of site ``bridge`` cuts us (at site ``own``) off from: every
    other site's when it is ours, else that site's."""
    if bridge == own:
        return sorted(n for n, s in sites.items() if s != own)
    return sorted(n for n, s in sites.items() if s == bridge)


def fleet_finished(node: int, rounds: int, members: list[int] | tuple[int, ...],
                   said_round: dict[int, int], known: set[int]) -> bool:
    """The fleet ran all of ``rounds``: every one of ``members`` but ``node`` said so in its
    latest status (a clean exit's offline status, or a lingering member's online one), or more
    than half of the ``known`` nodes did. The majority covers nodes cut off together: each
    names a round short of the end, so the view they are in never finishes; one liar alone
    ends nobody's run."""
    if rounds <= 0:
        return False
    done = {n for n, r in said_round.items() if n != node and r >= rounds}
    others = [m for m in members if m != node]
    if others and all(m in done for m in others):
        return True
    return len(done) * 2 > len(known | {node})
