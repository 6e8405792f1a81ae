"""Membership with sites: the coordinator's views name each member's site from its status,
and the tree of such a view reduces inside each site first."""

from __future__ import annotations

import pytest

from agent.protocol.membership import Membership, ModelIdentity, view_tree
from agent.protocol.messages import MessageError, Status, View

START = View(epoch=0, members=[0, 1, 2, 3, 4, 5], arity=2, coordinator=0, from_round=0)


def _site(node: int) -> str:
    return "barn" if node < 3 else "hall"


def test_views_carry_the_sites_the_statuses_name_and_a_failed_site_root_is_replaced() -> None:
    model = ModelIdentity("0123456789abcdef", "mlp", 10)  # a view on the wire names its model
    coordinator = Membership(0, 2, START, identity=model)
    for i in range(6):
        coordinator.on_status(Status(i, "online", site=_site(i), fingerprint=model.fingerprint), 0.0)
    coordinator.round_started(3, 1.0)
    out = coordinator.on_status(Status(3, "offline"), 1.0)  # the hall's site root
    view = out[0].view
    assert view.members == [0, 1, 2, 4, 5] and view.sites == ["barn", "barn", "barn", "hall", "hall"]
    tree = view_tree(view)
    assert tree.parent(4) == 0 and tree.parent(5) == 4  # the hall's next lowest took over
    assert {(a, b) for a, b in tree.tree_links() if tree.site(a) != tree.site(b)} == {(0, 4)}
    assert View.decode(view.encode()) == view


def test_without_sites_the_view_and_its_tree_ignore_them() -> None:
    coordinator = Membership(0, 2, START)
    for i in range(6):
        coordinator.on_status(Status(i, "online"), 0.0)
    coordinator.round_started(3, 1.0)
    view = coordinator.on_status(Status(5, "offline"), 1.0)[0].view
    assert view.sites == [] and view_tree(view).parent(4) == 1


@pytest.mark.parametrize("sites", [["a"], ["a b", "c"], ["x" * 33, "y"]])
def test_a_view_with_malformed_sites_is_refused(sites: list[str]) -> None:
    bad = View(1, [0, 1], 2, 0, 0, sites=sites)
    with pytest.raises(MessageError):
        View.decode(bad.encode())


def test_a_down_bridge_cuts_off_the_far_side_only() -> None:
    from agent.protocol.membership import cut_off

    sites = {0: "barn", 1: "barn", 2: "hall", 3: "hall", 4: "shop"}
    assert cut_off(sites, "barn", "hall") == [2, 3]  # another site's bridge: that site
    assert cut_off(sites, "hall", "hall") == [0, 1, 4]  # our own bridge: everyone elsewhere
    assert cut_off(sites, "barn", "yard") == []


def test_the_will_of_a_node_names_its_current_life() -> None:
    m = Membership(0, 2, START)
    m.on_status(Status(3, "online", round=7, incarnation=2, site="hall"), 0.0)
    will = m.will_of(3)
    assert (will.node, will.state, will.round, will.incarnation) == (3, "offline", 7, 2)


def test_bridge_topics_parse_only_site_names() -> None:
    from agent.protocol.topics import Topics

    topics = Topics("j")
    assert topics.parse_bridge(topics.bridge("s1")) == "s1"
    assert topics.parse_bridge("edgegrove/j/bridge/a/b") is None
    assert topics.parse_bridge("edgegrove/j/status/1") is None


def _cut_site_member() -> tuple[Membership, View]:
    """Node 4 of the hall, its site cut off the core: the barn's coordinator went on without
    the hall (its witnesses found the hall silent; node 4 saw none of it)."""
    member = Membership(4, 2, START)
    for i in range(6):
        member.on_status(Status(i, "online", site=_site(i)), 0.0)
    member.round_started(12, 1.0)
    return member, View(epoch=1, members=[0, 1, 2], arity=2, coordinator=0, from_round=14,
                        sites=["barn"] * 3)


def test_a_site_cut_off_takes_the_fleets_view_without_it_once_its_bridge_went_down() -> None:
    member, without_hall = _cut_site_member()
    member.cut_off()  # its own broker's word: the bridge to the core is down
    assert member.offer_view(without_hall, 0) is None
    assert member.views.newest == without_hall and 4 not in member.views.newest.members  # it rejoins


def test_a_view_dropping_our_site_is_held_while_our_bridge_stayed_up() -> None:
    # The coordinator (compromised, or wrong) cannot evict a site nobody saw go.
    member, without_hall = _cut_site_member()
    assert member.offer_view(without_hall, 0) is not None
    assert member.views.newest == START
