"""What a round may take from whom: a unit's contributors against its origin's subtree, a
result against our routes up."""

from __future__ import annotations

from agent.protocol.ft_scope import Hop, ResultSource, UnitSource, result_source, unit_source
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

TREE = Tree(tuple(range(7)), 2)  # 0 root; 1 over 3, 4; 2 over 5, 6


def unit(sender: int, ids: set[int], origin: int | None = None) -> Frame:
    return Frame(Kind.DATA, 1, 0, sender, 0, 1, origin=sender if origin is None else origin,
                 contributors=frozenset(ids))


def result(sender: int, origin: int | None = None) -> Frame:
    return Frame(Kind.DATA, 1, 0, sender, 0, 1, Flag.BROADCAST | Flag.FINAL,
                 origin=sender if origin is None else origin, contributors=frozenset(range(7)))


def test_a_unit_speaks_for_its_origins_subtree_and_no_more() -> None:
    assert unit_source(TREE, 0, unit(1, {1, 3, 4}), Hop.DIRECT) is UnitSource.BELOW
    assert unit_source(TREE, 0, unit(3, {3}), Hop.DIRECT) is UnitSource.BELOW  # around a dead parent
    assert unit_source(TREE, 0, unit(1, {1, 2, 3}), Hop.DIRECT) is UnitSource.OUTSIDE_SUBTREE
    assert unit_source(TREE, 1, unit(3, {3, 4}), Hop.DIRECT) is UnitSource.OUTSIDE_SUBTREE
    assert unit_source(TREE, 1, unit(5, {5}), Hop.DIRECT) is UnitSource.NOT_OURS  # not below us
    assert unit_source(TREE, 1, unit(3, {1, 3}), Hop.DIRECT) is UnitSource.NOT_OURS  # counts us


def test_a_relayed_unit_comes_through_a_backup_of_its_origin() -> None:
    assert unit_source(TREE, 1, unit(4, {3}, origin=3), Hop.RELAY) is UnitSource.BELOW  # 4: 3's sibling
    assert unit_source(TREE, 1, unit(5, {3}, origin=3), Hop.RELAY) is UnitSource.RELAY_NOT_A_BACKUP


def test_a_result_comes_from_our_parent_an_ancestor_or_a_backup_we_made_carry_it() -> None:
    assert result_source(TREE, 3, result(1), set()) is ResultSource.ABOVE  # the parent
    assert result_source(TREE, 3, result(0), set()) is ResultSource.ABOVE  # the grandparent
    assert result_source(TREE, 3, result(4), {4}) is ResultSource.ABOVE  # a sibling answers our pull
    assert result_source(TREE, 3, result(4, origin=1), {4}) is ResultSource.ABOVE  # relayed by our relay
    assert result_source(TREE, 2, result(3), {3}) is ResultSource.ELSEWHERE  # not above 2
    assert result_source(TREE, 3, result(5, origin=1), {5}) is ResultSource.ELSEWHERE  # relayed off route
    assert result_source(TREE, 1, result(3), {3}) is ResultSource.ELSEWHERE  # our own child


def test_a_backup_nobody_made_a_carrier_brings_no_result() -> None:
    """Issue 54: a sibling sent its victim results for the rounds ahead (189 of 200 rounds
    differed): a backup carries a result only when we asked it or routed through it."""
    assert result_source(TREE, 4, result(3), set()) is ResultSource.BACKUP_NOT_ROUTED
    assert result_source(TREE, 3, result(4, origin=1), set()) is ResultSource.BACKUP_NOT_ROUTED  # "relayed"
    assert result_source(TREE, 3, result(4), {1}) is ResultSource.BACKUP_NOT_ROUTED
    assert result_source(TREE, 2, result(1), set()) is ResultSource.BACKUP_NOT_ROUTED  # 1, 2: the root's children
