"""Membership: views from the lowest live id, start-up gating, joiners, incarnations."""

from __future__ import annotations

from agent.protocol.allreduce import DOWNLINK_BUSY_HOLD
from agent.protocol.membership import Membership, ModelIdentity, StartupGate, admits, refusal
from agent.protocol.messages import Status, Suspect, View

START = View(epoch=0, members=[0, 1, 2, 3], arity=2, coordinator=0, from_round=0)


def online(*ids: int, incarnation: int = 0) -> list[Status]:
    return [Status(i, "online", incarnation=incarnation) for i in ids]


def test_only_the_lowest_live_id_publishes_a_view_when_a_node_goes_offline() -> None:
    coordinator, other = Membership(0, 2, START), Membership(2, 2, START)
    for m in (coordinator, other):
        for s in online(0, 1, 2, 3):
            assert m.on_status(s, 0.0) == []  # nothing changed
    coordinator.round_started(7, 1.0)
    other.round_started(7, 1.0)
    assert other.on_status(Status(3, "offline"), 1.0) == []
    out = coordinator.on_status(Status(3, "offline"), 1.0)
    assert [p.view for p in out] == [View(1, [0, 1, 2], 2, 0, 9)]
    assert other.on_view(out[0].view) and not other.on_view(out[0].view)
    assert other.views.members_for(8) == (0, 1, 2, 3) and other.views.members_for(9) == (0, 1, 2)


def test_the_next_lowest_takes_over_when_the_coordinator_dies() -> None:
    m = Membership(1, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(4, 0.0)
    out = m.on_status(Status(0, "offline"), 0.0)
    assert out and out[0].view.members == [1, 2, 3] and out[0].view.coordinator == 1


def test_a_joiner_is_added_but_never_coordinates() -> None:
    joiner = Membership(0, 2, View(1, [1, 2, 3], 2, 1, 5))
    for s in (*online(1, 2, 3), Status(0, "joining", incarnation=1)):
        assert joiner.on_status(s, 0.0) == []
    assert joiner.coordinator() == 1
    coordinator = Membership(1, 2, View(1, [1, 2, 3], 2, 1, 5))
    coordinator.round_started(10, 0.0)
    out = coordinator.on_status(Status(0, "joining", incarnation=1), 0.0)
    assert out[0].view.members == [0, 1, 2, 3] and out[0].view.from_round == 12
    # The joiner adopts the view; the fleet's state comes from online members only.
    assert joiner.on_view(out[0].view)
    assert joiner.online_peers(joiner.live()) == [1, 2, 3]
    assert joiner.views.members_for(11) == (1, 2, 3) and joiner.views.members_for(12) == (0, 1, 2, 3)


def test_a_joiner_back_from_a_cut_asks_the_views_members_for_the_state_not_one_it_left_out() -> None:
    """Node 1, cut off with us, never sent its Will: its retained status still says online.
    The view we rejoin left it out; a stripe asked of it never came (the pull took 4.7 s)."""
    joiner = Membership(4, 2, View(6, [0, 2, 3, 4, 5, 6], 2, 0, 155))
    for s in (*online(0, 1, 2, 3, 6), Status(5, "joining", incarnation=1)):
        joiner.on_status(s, 0.0)
    assert joiner.online_peers(joiner.live()) == [0, 1, 2, 3, 6]
    assert joiner.state_holders() == [0, 2, 3, 6]


def test_a_dropped_nodes_status_from_far_behind_is_no_return_until_it_rejoins() -> None:
    """A bridge back from a cut replays its site's retained statuses, of the round the site
    was cut in: the node is not back (the fleet would wait for it) until it says joining."""
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(12, 0.0)
    assert m.on_view(View(1, [0, 1, 2], 2, 0, 14))  # 3 was found silent
    m.round_started(60, 0.0)
    assert m.on_status(Status(3, "online", round=11), 0.0) == []
    assert m.views.newest.members == [0, 1, 2]
    out = m.on_status(Status(3, "joining", round=11), 0.0)
    assert out[0].view.members == [0, 1, 2, 3] and out[0].view.from_round == 62


def test_a_dropped_node_online_at_the_fleets_round_is_back() -> None:
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(12, 0.0)
    assert m.on_view(View(1, [0, 1, 2], 2, 0, 14))
    m.round_started(60, 0.0)
    assert m.on_status(Status(3, "online", round=59), 0.0)[0].view.members == [0, 1, 2, 3]


def test_a_joiner_going_online_changes_no_view() -> None:
    coordinator = Membership(1, 2, View(2, [0, 1, 2], 2, 1, 12))
    for s in (*online(1, 2), Status(0, "joining", incarnation=5)):
        coordinator.on_status(s, 0.0)
    assert coordinator.on_status(Status(0, "online", incarnation=5), 0.0) == []
    assert coordinator.coordinator() == 0  # the lowest online id takes over from here


def test_a_stale_will_of_an_older_incarnation_is_ignored() -> None:
    m = Membership(1, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.on_status(Status(3, "online", incarnation=2), 0.0)
    assert m.on_status(Status(3, "offline", incarnation=1), 0.0) == []
    assert 3 in m.live() and m.is_online(3)


def test_a_will_with_the_current_incarnation_takes_the_node_offline() -> None:
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3, incarnation=1_700_000_000_000):
        m.on_status(s, 0.0)
    m.round_started(3, 0.0)
    will = Status(2, "offline", incarnation=1_700_000_000_000)
    out = m.on_status(will, 0.0)
    assert out[0].view.members == [0, 1, 3] and not m.is_online(2)
    # The restarted agent (a later incarnation) is not its dead predecessor: it is back,
    # in the next view once the last one took effect (round 5).
    assert m.on_status(Status(2, "joining", incarnation=1_700_000_000_999), 0.0) == []
    assert m.knows_incarnation(2, 1_700_000_000_999)
    assert m.round_started(5, 0.0)[0].view == View(2, [0, 1, 2, 3], 2, 0, 7)


def test_a_burst_of_flaps_collapses_into_one_view_change_that_the_fleet_can_reach() -> None:
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(60, 0.0)
    published = []
    for i in range(25):  # node 3's connection flaps: offline, online, offline, ...
        published += m.on_status(Status(3, "offline" if i % 2 == 0 else "online"), 0.0)
    assert [p.view.from_round for p in published] == [62]  # one change, two rounds ahead
    m.round_started(62, 0.0)  # the flapping ended with node 3 offline
    assert m.views.newest.members == [0, 1, 2]
    assert m.views.view_for(61) is not None and m.views.view_for(61).epoch == 0


def test_a_node_without_a_view_for_its_round_uses_the_newest_it_has() -> None:
    m = Membership(5, 2, View(4, [0, 5], 2, 0, 90))
    assert m.views.view_for(12) == View(4, [0, 5], 2, 0, 90)


def test_an_unrefuted_report_suspects_a_silent_node_and_the_next_lowest_takes_over() -> None:
    members = [Membership(i, 2, START) for i in range(4)]
    for m in members:
        for s in online(0, 1, 2, 3):
            m.on_status(s, 0.0)
        m.round_started(10, 0.0)
    one, two = members[1], members[2]
    # Node 0 (root, coordinator) froze: its child 1 reports it; it cannot refute.
    out = one.on_suspect(Suspect(1, 10, 0), 0.0)
    assert one.witnesses.suspected() == {0} and one.coordinator() == 1
    # The root is gone: no round of its tree can finish, so the new tree applies next round.
    assert [p.view for p in out] == [View(1, [1, 2, 3], 2, 1, 11)]
    assert two.on_suspect(Suspect(1, 10, 0), 0.0) == []  # not the coordinator
    # The resumed node 0 defers to the newer view: it is not a member, so it never coordinates.
    old = members[0]
    old.on_view(out[0].view)
    assert old.coordinator() == 1 and old.round_started(13, 0.0) == []
    # It rejoins (joining): no longer suspected, and the coordinator takes it back.
    one.round_started(12, 0.0)
    back = one.on_status(Status(0, "joining"), 0.0)
    assert not one.witnesses.suspected() and back[0].view.members == [0, 1, 2, 3]


def test_old_reports_and_a_silent_majority_evict_nobody() -> None:
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(20, 0.0)
    assert m.on_suspect(Suspect(2, 15, 3), 0.0) == []  # a report from long ago
    assert not m.witnesses.suspected()
    m.on_suspect(Suspect(1, 20, 3), 0.0)
    assert m.witnesses.suspected() == {3}
    # A congested broker: reports about half the fleet stand unrefuted. Not frozen nodes.
    m.on_suspect(Suspect(1, 20, 2), 0.0)
    assert m.witnesses.suspected() == {3}


def test_absent_statuses_do_not_shrink_the_view_at_start_up() -> None:
    m = Membership(0, 2, START)
    assert m.on_status(Status(0, "online"), 0.0) == []  # others' statuses not in yet


GATE = StartupGate(expected_members=3, join_grace=30.0, started_at=100.0)


def test_the_first_view_waits_for_the_expected_members() -> None:
    m = Membership(0, 2, gate=GATE)
    assert m.on_status(Status(0, "online"), 100.0) == []
    assert m.on_status(Status(2, "online"), 101.0) == []
    assert m.round_started(0, 102.0) == []  # 2 of 3, grace not over
    out = m.on_status(Status(1, "online"), 103.0)
    assert [p.view for p in out] == [View(1, [0, 1, 2], 2, 0, 0)]  # applies at once, round 0
    assert m.views.view_for(0) == out[0].view
    assert m.round_started(0, 104.0) == []  # published once


def test_the_first_view_goes_out_without_the_missing_after_the_grace() -> None:
    m = Membership(0, 2, gate=GATE)
    m.on_status(Status(0, "online"), 100.0)
    m.on_status(Status(1, "online"), 100.5)
    assert m.round_started(0, 129.9) == []
    out = m.round_started(0, 130.0)
    assert out[0].view.members == [0, 1] and out[0].view.from_round == 0
    # The latecomer is added two rounds ahead, like any joiner.
    m.round_started(4, 140.0)
    late = m.on_status(Status(2, "online"), 140.0)
    assert late[0].view == View(2, [0, 1, 2], 2, 0, 6)


def test_only_the_coordinator_passes_the_gate() -> None:
    m = Membership(1, 2, gate=GATE)
    for s in online(0, 1, 2):
        assert m.on_status(s, 200.0) == []
    assert m.views.latest is None and m.views.view_for(0) is None
    m.on_view(View(1, [0, 1, 2], 2, 0, 0))
    assert m.views.members_for(0) == (0, 1, 2)


def test_a_retained_view_of_a_running_fleet_skips_the_gate() -> None:
    m = Membership(1, 2, gate=GATE)
    m.on_view(View(4, [1, 2], 2, 1, 20))
    m.round_started(20, 100.0)
    assert m.on_status(Status(1, "online"), 100.0) == []  # the view is known: nothing to wait for
    out = m.on_status(Status(3, "joining", incarnation=2), 100.0)
    assert out[0].view == View(5, [1, 2, 3], 2, 1, 22)


def test_a_report_counts_only_after_the_grace_and_a_refutation_cancels_it() -> None:
    m = Membership(1, 2, START, grace=0.3)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(10, 0.0)
    m.on_suspect(Suspect(1, 10, 0), 1.0)
    assert m.on_suspect(Suspect(2, 10, 0), 1.1) == [] and not m.witnesses.suspected()
    assert m.next_check() == 1.3 and m.witnesses.unrefuted(1.2) == []
    # Node 0 is alive (cut links around it, not frozen): it refutes at the fleet's round.
    m.on_status(Status(0, "online", round=10), 1.15)
    assert m.check(2.0) == [] and not m.witnesses.suspected() and m.witnesses.unrefuted(2.0) == []
    # Frozen this time: the reports stand, and after the grace node 0 is suspected.
    m.on_suspect(Suspect(1, 11, 0), 3.0)
    m.on_suspect(Suspect(2, 11, 0), 3.0)
    assert m.witnesses.unrefuted(3.3) == [(0, 11), (0, 11)]
    assert m.check(3.3)[0].view.members == [1, 2, 3] and m.witnesses.suspected() == {0}
    # Resumed far behind, its status does not clear the suspicion; rejoining does.
    m.round_started(20, 4.0)
    m.on_status(Status(0, "online", round=11), 4.0)
    assert m.witnesses.suspected() == {0}
    m.on_status(Status(0, "joining", round=11), 4.1)
    assert not m.witnesses.suspected()


def test_a_witness_reporting_again_does_not_restart_the_grace() -> None:
    m = Membership(0, 2, START, grace=0.4)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(30, 0.0)
    m.on_suspect(Suspect(1, 30, 3), 1.0)  # node 1's round 30 waits for its silent child 3
    m.on_suspect(Suspect(1, 29, 3), 1.3)  # node 1's round 29, lingering for 3's ACKs, gives up
    assert m.witnesses.unrefuted(1.4) == [(3, 30)] and m.check(1.4)[0].view.members == [0, 1, 2]
    # Once the suspect spoke, a new report starts a new grace.
    m2 = Membership(0, 2, START, grace=0.4)
    for s in online(0, 1, 2, 3):
        m2.on_status(s, 0.0)
    m2.round_started(30, 0.0)
    m2.on_suspect(Suspect(1, 30, 3), 1.0)
    m2.on_status(Status(3, "online", round=30), 1.1)
    m2.on_suspect(Suspect(1, 31, 3), 1.3)
    assert m2.witnesses.unrefuted(1.4) == [] and m2.witnesses.unrefuted(1.8) == [(3, 31)]


def test_while_our_links_show_a_backlog_a_report_stands_a_busy_hold_longer() -> None:
    # Slow links: the accused hears the report, and we its refutation, behind large frames.
    def fleet() -> Membership:
        m = Membership(0, 2, START, grace=0.4)
        for s in online(0, 1, 2, 3):
            m.on_status(s, 0.0)
        m.round_started(1, 0.0)
        return m

    busy = fleet()
    busy.witnesses.links_busy(0.9)  # a large frame was still arriving just before the report
    busy.on_suspect(Suspect(3, 1, 1), 1.0)
    assert busy.next_check() == 1.0 + 0.4 + DOWNLINK_BUSY_HOLD
    assert busy.check(1.5) == [] and busy.witnesses.unrefuted(1.5) == [] and not busy.witnesses.suspected()
    busy.on_status(Status(1, "online", round=1), 1.8)  # the refutation, late but in time
    assert busy.check(3.0) == [] and not busy.witnesses.suspected()
    # Frozen after all: it is suspected, a busy hold later than on idle links.
    busy.on_suspect(Suspect(3, 2, 1), 3.0)
    busy.witnesses.links_busy(3.1)
    assert busy.check(3.5) == [] and busy.check(3.0 + 0.4 + DOWNLINK_BUSY_HOLD)[0].view.members == [0, 2, 3]
    # The suspect's downlink busy (its PROGRESS): it hears the report late, the same hold.
    slow = fleet()
    slow.on_suspect(Suspect(3, 1, 1), 1.0)
    slow.witnesses.peer_busy(1, 1.1)
    slow.witnesses.peer_busy(2, 0.5)  # another node's busy link says nothing about node 1
    assert slow.next_check() == 1.0 + 0.4 + DOWNLINK_BUSY_HOLD and slow.check(1.5) == []
    # Idle links: the grace alone (a backlog long before the report does not count).
    idle = fleet()
    idle.witnesses.links_busy(1.0 - DOWNLINK_BUSY_HOLD - 0.1)
    idle.on_suspect(Suspect(3, 1, 1), 1.0)
    assert idle.next_check() == 1.4 and idle.check(1.4)[0].view.members == [0, 2, 3]


def test_a_backlog_that_ended_before_the_report_adds_nothing_to_its_grace() -> None:
    """A starved host reads every large frame slowly: the previous round's result still
    arrived at us and at the suspect half a second before it was cut off and reported, and
    the report stood 1.4 s instead of 0.4 (the survivors' round ran into its wait cap)."""
    m = Membership(0, 2, START, grace=0.4)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(1, 0.0)
    m.witnesses.links_busy(0.5)
    m.witnesses.peer_busy(1, 0.5)
    m.on_suspect(Suspect(3, 1, 1), 1.0)
    assert m.next_check() == 1.4 and m.check(1.4)[0].view.members == [0, 2, 3]


def test_only_the_coordinators_view_counts_and_epochs_advance_by_small_steps() -> None:
    m = Membership(2, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(40, 0.0)
    # Node 3 (valid credentials, not the coordinator) on its own view topic: two members left.
    forged = View(1, [2, 3], 2, 3, 41)
    assert m.offer_view(forged, 3) == "view_not_coordinator" and m.views.newest == START  # held back, not taken
    assert m.offer_view(View(1, [2, 3], 2, 0, 41), 3) == "view_not_its_publishers"
    assert m.offer_view(View(2**53, [0, 1, 2, 3], 2, 0, 41), 0) == "view_epoch_jump"
    assert m.views.newest == START
    legit = View(1, [0, 1, 2], 2, 0, 42)
    m.on_status(Status(3, "offline"), 0.1)  # node 3's Will: a view without it is believed
    assert m.offer_view(legit, 0) is None and m.views.newest == legit
    # A view held back is taken once its publisher is the coordinator (the one before is gone).
    m2 = Membership(2, 2, START)
    for s in online(0, 1, 2, 3):
        m2.on_status(s, 0.0)
    takeover = View(1, [1, 2, 3], 2, 1, 12)
    assert m2.offer_view(takeover, 1) == "view_not_coordinator" and m2.views.newest == START
    m2.on_status(Status(0, "offline"), 0.1)  # node 0's Will, arriving after the view
    assert m2.views.newest == takeover


def test_a_suspected_node_stays_suspected_while_its_will_settles() -> None:
    # A frozen node's Will is not the node speaking: clearing the suspicion on it left the
    # node in the views for the whole settle time (1 s on a real agent).
    m = Membership(1, 2, START, grace=0.3, offline_settle=1.0)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(10, 0.0)
    m.on_suspect(Suspect(2, 10, 3), 1.0)
    m.check(1.3)
    assert m.witnesses.suspected() == {3}
    m.on_status(Status(3, "offline", round=10), 1.4)
    assert m.witnesses.suspected() == {3}


def test_even_the_coordinator_removes_only_members_we_saw_go_offline_or_reported_silent() -> None:
    m = Membership(2, 2, START, grace=0.3)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(40, 0.0)
    # A compromised coordinator (node 0, valid credentials) drops healthy node 3.
    evict = View(1, [0, 1, 2], 2, 0, 42)
    assert m.offer_view(evict, 0) == "view_removal_unwitnessed" and m.views.newest == START
    assert m.views.view_for(42) == START  # we keep training with node 3
    # Node 3 really goes silent: a member reports it, and the held view is believed.
    m.on_suspect(Suspect(1, 40, 3), 0.5)
    assert m.views.newest == evict
    # A flap: the Will came and went before the view did; seen, so believed at once.
    m2 = Membership(2, 2, START)
    for s in online(0, 1, 2, 3):
        m2.on_status(s, 0.0)
    m2.round_started(40, 0.0)
    m2.on_status(Status(3, "offline"), 0.1)
    m2.on_status(Status(3, "online", 40), 0.2)
    assert m2.offer_view(View(1, [0, 1, 2], 2, 0, 42), 0) is None and m2.views.newest.members == [0, 1, 2]
    # Evidence goes stale: a Will seen long ago does not vouch for a removal now.
    m2.round_started(60, 1.0)
    assert m2.offer_view(View(2, [0, 1, 2, 3], 2, 0, 62), 0) is None  # 3 is back
    m2.round_started(63, 1.1)
    assert m2.offer_view(View(3, [0, 1, 2], 2, 0, 65), 0) == "view_removal_unwitnessed"


def test_a_view_that_removes_us_is_taken_without_evidence() -> None:
    # We hung and the fleet went on without us: we must learn it to rejoin (see offer_view).
    m = Membership(3, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(40, 0.0)
    m.on_suspect(Suspect(1, 40, 3), 0.1)
    assert m.offer_view(View(1, [0, 1, 2], 2, 0, 42), 0) is None and 3 not in m.views.newest.members


def test_a_coordinator_taken_for_silent_yields_its_own_view_to_the_fleets_of_the_same_epoch() -> None:
    """Overloaded, node 0 was reported silent and node 1 took over; meanwhile node 0 still
    published a view of its own at the same epoch. Ours won the tie (lower id), so node 1's
    view was old news here: node 0 never learnt it was out, and never rejoined (seen with
    three fleets on one host: the run ended without it)."""
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(20, 0.0)
    m.on_suspect(Suspect(1, 20, 0), 0.1)  # about us: we refute, too late for the others
    ours = m.on_status(Status(3, "offline"), 2.0)
    assert [p.view.coordinator for p in ours] == [0] and m.views.newest.epoch == 1
    fleets = View(1, [1, 2, 3], 2, 1, 21)
    assert m.offer_view(fleets, 1) is None
    assert m.views.newest == fleets and m.views.view_for(21) == fleets and m.coordinator() == 1
    # Not reported silent, a tie is still ours: nobody else's view replaces a coordinator's.
    n = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        n.on_status(s, 0.0)
    n.round_started(20, 0.0)
    n.on_status(Status(3, "offline"), 2.0)
    n.offer_view(fleets, 1)
    assert n.views.newest.coordinator == 0


def test_a_dropped_node_comes_back_only_by_speaking_after_it_was_dropped() -> None:
    # Node 1 takes over from a coordinator that dropped node 3 (frozen: no Will, its last
    # "online" still retained). The reports about 3 expire; 3 must not come back on that old
    # status (a resumed coordinator re-added a frozen node: property test, CI), only when it
    # speaks again.
    m = Membership(1, 2, START, grace=5.0)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(10, 0.0)
    m.on_suspect(Suspect(2, 10, 3), 0.1)  # evidence enough to believe the removal
    assert m.offer_view(View(1, [0, 1, 2], 2, 0, 12), 0) is None
    m.on_status(Status(0, "offline"), 0.2)  # the coordinator's Will: node 1 coordinates
    published = m.round_started(14, 0.3)  # the report about 3 has expired
    assert all(3 not in p.view.members for p in published), published
    back = m.on_status(Status(3, "joining", 14), 0.4)  # it resumed and rejoins
    assert back == [] or 3 in back[-1].view.members
    later = [p.view for r in range(15, 20) for p in m.round_started(r, 0.5 + r / 100)]
    assert 3 in m.views.newest.members, (back, later)


def test_a_will_settles_at_the_very_check_it_asked_for() -> None:
    # (t + 1.0) - t < 1.0 for this t: the settle was judged unfinished at the check that
    # next_check scheduled for it, and nothing woke the coordinator again until the dead
    # root's wait ran out (5 s of a stalled fleet after a root crash).
    t = 0.9226073066666617
    m = Membership(1, 2, START, offline_settle=1.0)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(10, 0.5)
    assert m.on_status(Status(0, "offline"), t) == []  # settling
    wake = m.next_check()
    assert wake == t + 1.0
    views = [p.view for p in m.check(wake)]
    assert [(v.members, v.coordinator, v.from_round) for v in views] == [([1, 2, 3], 1, 11)]


def test_healthy_nodes_refuting_too_late_one_after_another_never_empty_the_fleet() -> None:
    """A congested broker (an embedded one on a loaded host): every refutation comes after
    the grace. Each report alone is a minority of the view it shrinks; together they are
    not, and the coordinator stops evicting (seen: 7 agents down to 2 in one second)."""
    seven = View(epoch=0, members=list(range(7)), arity=2, coordinator=0, from_round=0)
    m = Membership(0, 2, seven, grace=0.3)
    for s in online(*range(7)):
        m.on_status(s, 0.0)
    m.round_started(3, 0.0)
    evicted: list[int] = []
    for k, peer in enumerate([2, 4, 5, 1, 6]):
        t = 1.0 + k
        m.on_suspect(Suspect(3, 3, peer), t)
        m.check(t + 0.31)  # unrefuted for the grace: suspected
        if peer in m.witnesses.suspected():
            evicted.append(peer)
        m.on_status(Status(peer, "online", round=3), t + 0.5)  # its refutation, too late
    assert evicted == [2, 4, 5]  # three of seven: a minority, however the view shrank
    assert set(m.views.newest.members) >= {0, 1, 3, 6}
    # Rounds later the window has passed: a frozen node is evicted again.
    m.round_started(3 + 9, 10.0)
    m.on_suspect(Suspect(3, 12, 6), 10.0)
    m.check(10.31)
    assert m.witnesses.suspected() == {6}


def test_the_coordinator_changes_the_chunk_size_by_a_view_of_the_same_members() -> None:
    coordinator, other = Membership(0, 2, START), Membership(1, 2, START)
    for m in (coordinator, other):
        for s in online(0, 1, 2, 3):
            m.on_status(s, 0.0)
        m.round_started(7, 1.0)
    assert other.change_chunks(32768) == []  # only the coordinator decides
    out = coordinator.change_chunks(32768)
    assert [p.view for p in out] == [View(1, [0, 1, 2, 3], 2, 0, 9, chunk_values=32768)]
    assert coordinator.change_chunks(32768) == []  # the newest view has it already
    assert coordinator.change_chunks(0) == []  # the change is still pending: one at a time
    other.on_view(out[0].view)
    assert other.views.view_for(8) == START and other.views.view_for(9).chunk_values == 32768  # type: ignore[union-attr]
    coordinator.round_started(9, 2.0)
    # A membership change keeps the chunk size; going back is a view of its own.
    removed = coordinator.on_status(Status(3, "offline"), 2.0)
    assert [(p.view.members, p.view.chunk_values) for p in removed] == [([0, 1, 2], 32768)]
    coordinator.round_started(11, 3.0)
    assert [p.view.chunk_values for p in coordinator.change_chunks(0)] == [0]


def test_the_coordinator_changes_the_broadcast_by_a_view_and_a_membership_change_keeps_it() -> None:
    coordinator = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        coordinator.on_status(s, 0.0)
    coordinator.round_started(7, 1.0)
    out = coordinator.change_chunks(32768, "fanout")
    assert [p.view for p in out] == [View(1, [0, 1, 2, 3], 2, 0, 9, chunk_values=32768, broadcast="fanout")]
    coordinator.round_started(9, 2.0)
    assert coordinator.change_chunks(32768) == []  # None: the newest view's broadcast, nothing new
    removed = coordinator.on_status(Status(3, "offline"), 2.0)
    assert [(p.view.members, p.view.broadcast) for p in removed] == [([0, 1, 2], "fanout")]
    coordinator.round_started(11, 3.0)
    assert [(p.view.chunk_values, p.view.broadcast) for p in coordinator.change_chunks(32768, "")] == [(32768, "")]


# -- one model per fleet -------------------------------------------------------------------------

MODEL_A = ModelIdentity("aaaaaaaaaaaaaaaa", "mnist-cnn", 1234)
MODEL_B = ModelIdentity("bbbbbbbbbbbbbbbb", "mlp", 407050)


def running(node: int, model: ModelIdentity, state: str = "online") -> Status:
    return Status(node, state, fingerprint=model.fingerprint, model=model.name,  # type: ignore[arg-type]
                  params=model.params)


def test_admits_only_the_fleets_fingerprint() -> None:
    assert admits(MODEL_A, running(3, MODEL_A))
    assert not admits(MODEL_A, running(3, MODEL_B))
    assert not admits(MODEL_A, Status(3, "online"))  # one that does not say is not ours either
    assert admits(ModelIdentity(), running(3, MODEL_B))  # a coordinator that does not know its own


def test_refusal_needs_the_views_coordinator_to_stand_for_its_model() -> None:
    view = View(1, [0, 1], 2, 0, 0, fingerprint=MODEL_A.fingerprint, model=MODEL_A.name, params=MODEL_A.params)
    refused = refusal(MODEL_B, view, MODEL_A.fingerprint)
    assert refused is not None and refused.fleet == MODEL_A and refused.own == MODEL_B
    line = refused.line()
    assert "bbbbbbbbbbbbbbbb differs from the fleet's aaaaaaaaaaaaaaaa" in line
    assert "model mlp, 407,050 params vs model mnist-cnn, 1,234 params" in line and "\n" not in line
    assert refusal(MODEL_A, view, MODEL_A.fingerprint) is None  # the same model
    assert refusal(MODEL_B, view, MODEL_B.fingerprint) is None  # a stale view of an earlier run
    assert refusal(MODEL_B, view, None) is None  # its coordinator not heard yet
    assert refusal(MODEL_B, View(1, [0, 1], 2, 0, 0), MODEL_A.fingerprint) is None  # names none


def test_the_coordinator_never_admits_a_member_with_another_model() -> None:
    m = Membership(0, 2, gate=StartupGate(expected_members=3, join_grace=30.0), identity=MODEL_A)
    m.on_status(running(0, MODEL_A), 0.0)
    m.on_status(running(1, MODEL_A), 0.0)
    out = m.on_status(running(2, MODEL_B), 0.0)  # the third has come: the gate opens without it
    assert [p.view.members for p in out] == [[0, 1]]
    assert (out[0].view.fingerprint, out[0].view.model, out[0].view.params) == ("aaaaaaaaaaaaaaaa", "mnist-cnn", 1234)
    assert m.live() == [0, 1] and m.admission.foreign == {2}
    m.round_started(5, 1.0)
    assert m.on_status(running(2, MODEL_B, "joining"), 1.0) == []  # asking again changes nothing
    # Restarted with the fleet's model, it is taken in.
    out = m.on_status(Status(2, "online", incarnation=1, fingerprint=MODEL_A.fingerprint), 2.0)
    assert [p.view.members for p in out] == [[0, 1, 2]] and m.admission.foreign == set()


def test_a_member_restarted_with_another_model_leaves_the_view() -> None:
    start = View(1, [0, 1, 2], 2, 0, 0, fingerprint=MODEL_A.fingerprint)
    m = Membership(0, 2, start, identity=MODEL_A)
    for node in (0, 1, 2):
        m.on_status(running(node, MODEL_A), 0.0)
    m.round_started(4, 1.0)
    out = m.on_status(Status(2, "online", incarnation=5, fingerprint=MODEL_B.fingerprint), 1.0)
    assert [p.view.members for p in out] == [[0, 1]]
    other = Membership(1, 2, start, identity=MODEL_A)  # a member takes that view: it saw it too
    for node in (0, 1):
        other.on_status(running(node, MODEL_A), 0.0)
    other.on_status(Status(2, "online", incarnation=5, fingerprint=MODEL_B.fingerprint), 1.0)
    assert other.offer_view(out[0].view, 0) is None and other.views.members_for(9) == (0, 1)


def test_an_agent_with_another_model_is_refused_by_the_fleets_view() -> None:
    m = Membership(2, 2, identity=MODEL_B)
    view = View(1, [0, 1], 2, 0, 0, fingerprint=MODEL_A.fingerprint, model=MODEL_A.name, params=MODEL_A.params)
    assert m.offer_view(view, 0) is None  # its coordinator not heard yet: neither taken nor refused
    assert m.views.latest is None and m.admission.refused is None
    m.on_status(running(0, MODEL_A), 0.1)  # now it is: the coordinator runs model A
    assert m.admission.refused is not None and m.admission.refused.fleet.fingerprint == MODEL_A.fingerprint
    assert m.views.latest is None  # never took the view


def test_a_stale_view_of_another_model_refuses_nobody() -> None:
    m = Membership(2, 2, identity=MODEL_B)
    m.on_status(running(0, MODEL_B), 0.0)  # the coordinator of that view runs our model now
    old = View(7, [0, 1, 2], 2, 0, 40, fingerprint=MODEL_A.fingerprint)
    assert m.offer_view(old, 0) is None
    assert m.admission.refused is None and m.views.latest is None and m.admission.unconfirmed is None


# -- one device's credentials against membership (issue 38) ------------------------------------


def test_a_status_counts_only_for_the_node_its_topic_names() -> None:
    from agent.protocol.membership import StatusSource, status_source
    assert status_source(Status(3, "online"), 3) is StatusSource.OWN
    assert status_source(Status(0, "offline", incarnation=9), 3) is StatusSource.FORGED


def test_a_first_view_is_taken_only_from_the_lowest_online_node_with_an_epoch_the_fleet_can_follow() -> None:
    from agent.protocol.membership import FirstView, first_view
    m = Membership(2, 2)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    assert first_view(View(2**53, [3], 2, 3, 0), 3, m.node, m.states, m.witnesses.suspected()) is FirstView.EPOCH_TOO_HIGH
    assert m.offer_view(View(2**53, [3], 2, 3, 0), 3) == "first_view_epoch" and m.views.latest is None
    hijack = View(1, [0, 1, 2, 3], 2, 3, 0)  # node 3 before the fleet's first view
    assert m.offer_view(hijack, 3) == "first_view_not_coordinator" and m.views.latest is None
    fleets = View(1, [0, 1, 2, 3], 2, 0, 0)
    assert first_view(fleets, 0, m.node, m.states, m.witnesses.suspected()) is FirstView.TAKE
    assert m.offer_view(fleets, 0) is None and m.views.latest == fleets
    assert m.coordinator() == 0


def test_a_first_view_from_a_node_not_heard_yet_waits_for_its_status() -> None:
    m = Membership(2, 2, gate=StartupGate(expected_members=4, join_grace=60.0))
    m.on_status(Status(2, "online"), 0.0)
    view = View(3, [1, 2, 3], 2, 1, 20)
    assert m.offer_view(view, 1) is None and m.views.latest is None  # held, not counted
    m.on_status(Status(1, "online"), 0.1)
    assert m.views.latest == view


def test_a_lower_node_restarting_into_a_fleet_that_went_on_takes_its_view() -> None:
    # Node 0 was dropped; node 1 coordinates [1, 2, 3]. Node 0's own status is no evidence.
    m = Membership(0, 2, gate=StartupGate(expected_members=5, join_grace=60.0))
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    view = View(4, [1, 2, 3], 2, 1, 30)
    assert m.offer_view(view, 1) is None and m.views.latest == view and m.coordinator() == 1


def test_a_suspicion_names_our_round_or_the_next() -> None:
    from agent.protocol.membership import SuspicionRound, suspicion_round
    assert suspicion_round(10, 10) is SuspicionRound.TIMELY
    assert suspicion_round(11, 10) is SuspicionRound.TIMELY
    assert suspicion_round(8, 10) is SuspicionRound.TIMELY
    assert suspicion_round(12, 10) is SuspicionRound.AHEAD
    assert suspicion_round(7, 10) is SuspicionRound.EXPIRED


def test_a_far_future_suspicion_repeated_evicts_nobody() -> None:
    m = Membership(0, 2, START, grace=0.3)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(10, 0.0)
    far = Suspect(3, 10**6, 2)
    assert m.witnesses.judge(far, m.round) == "suspect_future_round"
    for t in range(5):
        m.on_suspect(far, 1.0 + t)
        m.check(1.5 + t)
    assert m.witnesses.suspected() == frozenset() and 2 not in m.witnesses.reports


def test_a_suspicion_its_suspect_refuted_counts_no_more_in_that_round() -> None:
    m = Membership(0, 2, START, grace=0.3)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(10, 0.0)
    report = Suspect(3, 10, 2)
    assert m.witnesses.judge(report, m.round) is None
    m.on_suspect(report, 1.0)
    m.on_status(Status(2, "online", round=10), 1.1)  # node 2 refutes it
    assert m.witnesses.judge(report, m.round) == "suspect_refuted"  # the same again: no new evidence
    m.on_suspect(report, 1.2)
    m.check(2.0)
    assert m.witnesses.suspected() == frozenset()
    assert m.witnesses.judge(Suspect(3, 11, 2), m.round) is None  # the next round's is evidence again


def test_a_view_without_the_coordinator_counts_only_from_the_member_next_in_line() -> None:
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(20, 0.0)
    m.on_suspect(Suspect(3, 20, 0), 0.1)  # about us, from node 3
    forged = View(1, [1, 2, 3], 2, 3, 21)  # and a view without us, from node 3
    assert m.offer_view(forged, 3) == "view_takes_us_out" and m.views.newest == START
    fleets = View(1, [1, 2, 3], 2, 1, 21)  # the next in line's is news, as before
    assert m.offer_view(fleets, 1) is None and m.views.newest == fleets


def test_a_node_whose_own_will_came_takes_the_fleets_view_however_far_it_moved_on() -> None:
    """Cut off the network, we missed every view the fleet published meanwhile, and the
    removals in them we could not witness: the retained view is the one way back. Before our
    Will, the same view is refused (a forged jump); an epoch nobody can follow, always."""
    m = Membership(2, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(40, 0.0)
    moved_on = View(9, [0, 1, 2], 2, 0, 90)  # 3 was dropped while we could not see it
    assert m.offer_view(moved_on, 0) == "view_epoch_jump" and m.views.newest == START
    m.on_status(Status(2, "offline", round=40), 5.0)  # our own Will: the broker dropped us
    m.on_status(Status(2, "online", round=40), 9.0)  # back
    assert m.offer_view(View(2**53, [0, 1, 2], 2, 0, 90), 0) == "view_epoch_jump"
    assert m.offer_view(moved_on, 0) is None and m.views.newest == moved_on
    # Back in step: the next jump is refused again.
    assert m.offer_view(View(20, [0, 1, 2], 2, 0, 95), 0) == "view_epoch_jump"


def test_a_view_keeps_a_majority_of_the_newest_or_half_with_its_lowest_member() -> None:
    """The quorum of a view change (docs/PARTITIONS.md): more than half of the newest view's
    members, or exactly half holding its lowest id. So a side cut off with fewer never forms
    a fleet of its own (the whole fleet offline but us: we do not coordinate a fleet of one),
    and of a 50/50 split only the side of the lowest id goes on."""
    six = View(epoch=1, members=[0, 1, 2, 3, 4, 5], arity=2, coordinator=0, from_round=0)
    for side, goes_on in (([0, 1, 2], True), ([3, 4, 5], False), ([0, 1, 2, 3], True), ([4, 5], False)):
        coordinator = side[0]
        m = Membership(coordinator, 2, six)
        for s in online(*range(6)):
            m.on_status(s, 0.0)
        for n in set(range(6)) - set(side):
            m.on_status(Status(n, "offline", round=10), 1.0)  # the other side's Wills
        m.round_started(10, 100.0)
        m.round_started(10, 100.0 + 11.0)  # long past the mass-down hold
        assert m.views.newest.members == (side if goes_on else six.members), (side, m.views.newest)
    alone = Membership(5, 2, START)  # 5 is no member: it never coordinates the view away
    for s in online(5):
        alone.on_status(s, 0.0)
    for n in range(4):
        alone.on_status(Status(n, "offline", round=3), 1.0)
    assert alone.round_started(3, 50.0) == [] and alone.round_started(3, 70.0) == []
    # The coordinator on the minority side: the Wills come one by one, each view kept a
    # majority of the one just before it (not yet in effect), down to two of five.
    five = View(epoch=1, members=[0, 1, 2, 3, 4], arity=2, coordinator=0, from_round=0)
    m = Membership(0, 2, five)
    for s in online(*range(5)):
        m.on_status(s, 0.0)
    for n in (2, 3, 4):
        m.on_status(Status(n, "offline", round=10), 1.0)
    m.round_started(0, 100.0)
    m.round_started(0, 111.0)
    assert len(m.views.newest.members) * 2 > len(five.members), m.views.newest


def test_nodes_back_from_a_cut_join_the_pending_view_or_the_one_right_after() -> None:
    """A group healed together comes back within a moment: each joiner used to wait for the
    previous one's view to take effect (two rounds each). Now a joiner of the same round
    replaces the pending view (same first round) and one of the next round follows at once."""
    m = Membership(0, 2, View(5, [0, 2, 3, 6], 2, 0, 30))
    m.round_started(30, 0.0)
    for s in (*online(0, 2, 3, 6), Status(1, "offline"), Status(4, "offline"), Status(5, "offline")):
        m.on_status(s, 0.0)
    m.round_started(40, 10.0)
    first = m.on_status(Status(1, "joining"), 10.0)
    assert [(p.view.epoch, p.view.members, p.view.from_round) for p in first] == [(6, [0, 1, 2, 3, 6], 42)]
    same_round = m.on_status(Status(4, "joining"), 10.2)
    assert [(p.view.epoch, p.view.members, p.view.from_round) for p in same_round] == [(7, [0, 1, 2, 3, 4, 6], 42)]
    m.round_started(41, 10.5)
    next_round = m.on_status(Status(5, "joining"), 10.6)
    assert [(p.view.epoch, p.view.members, p.view.from_round) for p in next_round] == [(8, [0, 1, 2, 3, 4, 5, 6], 43)]
    assert m.views.members_for(42) == (0, 1, 2, 3, 4, 6) and m.views.members_for(43) == (0, 1, 2, 3, 4, 5, 6)


def test_a_node_left_out_before_its_will_came_is_taken_back_at_once() -> None:
    """Cut off, node 3 is found silent by the witnesses and left out; at the heal its new
    connection takes the session over and the broker publishes the old one's Will. That Will
    is no flap: node 3 is back in the next view as soon as it says so, not STABLE_ROUNDS
    later (then two rounds of lead more: 9 rounds from the heal to all back on mosquitto)."""
    m = Membership(0, 2, START, grace=0.3)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(20, 0.0)
    m.on_suspect(Suspect(1, 20, 3), 0.1)
    assert m.check(0.5)[0].view.members == [0, 1, 2]
    m.round_started(50, 10.0)
    assert m.on_status(Status(3, "offline"), 10.0) == []  # the takeover's Will
    back = m.on_status(Status(3, "joining", 21), 10.01)
    assert [(p.view.members, p.view.from_round) for p in back] == [([0, 1, 2, 3], 52)]


def test_a_flapping_node_left_out_by_its_own_will_still_waits_to_stay_up() -> None:
    """A Will while out of the view too, but the previous one (that took it out) came a
    round before: a flapping connection, taken back only once it stayed up STABLE_ROUNDS."""
    m = Membership(0, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(20, 0.0)
    assert m.on_status(Status(3, "offline"), 0.0)[0].view.members == [0, 1, 2]
    assert m.on_status(Status(3, "online", 20), 0.05) == []
    m.round_started(21, 0.1)
    assert m.on_status(Status(3, "offline"), 0.12) == []  # out of the view: its own Will did that
    assert m.on_status(Status(3, "online", 21), 0.15) == [], "a flap within FLAP_WINDOW_ROUNDS waits"
    m.round_started(22, 0.2)
    assert [p.view.members for p in m.round_started(23, 0.3)] == [[0, 1, 2, 3]]


def test_the_fleet_is_finished_when_the_view_or_a_majority_of_the_nodes_say_so() -> None:
    m = Membership(4, 2, View(0, list(range(6)), 2, 0, 0))
    for s in online(*range(6)):
        m.on_status(s, 0.0)
    m.on_status(Status(0, "offline", round=100), 1.0)
    assert not m.finished(100, [0, 3, 4, 5])  # one node's word (a liar's, perhaps) ends nothing
    m.on_status(Status(1, "offline", round=100), 1.0)
    m.on_status(Status(2, "offline", round=100), 1.0)
    assert not m.finished(100, [3, 4, 5])  # half of the six, and 3 and 5 are short of the end
    m.on_status(Status(5, "online", round=100), 1.0)
    assert m.finished(100, [3, 4, 5])  # four of six ran all rounds: 3 waiting too changes nothing
    assert not m.finished(0, [3, 4, 5])  # a run without a round count never finishes
    assert Membership(4, 2, START).finished(10, []) is False


def test_a_member_restarted_before_its_will_removed_it_gets_a_view_to_join() -> None:
    """A device restarted at once (systemd) is back, a new life with no state, before the
    Will's settle time removed it: no membership change, so no view, and it waited to join
    for ever (a ps-sync fleet in CI: its pulls unanswered, every round at its deadline). A
    new life of a member is taken in again by a view from a round ahead; a reconnect of the
    same life is not a change."""
    m = Membership(0, 2, START, offline_settle=1.0)
    for s in online(0, 1, 2, 3, incarnation=1):
        m.on_status(s, 0.0)
    m.round_started(20, 0.0)
    assert m.on_status(Status(2, "offline", incarnation=1), 1.0) == []  # settling
    assert m.on_status(Status(2, "online", 0, incarnation=1), 1.2) == [], "the same life reconnected"
    back = m.on_status(Status(2, "online", 4, incarnation=2), 1.5)
    assert [(p.view.members, p.view.from_round) for p in back] == [([0, 1, 2, 3], 22)]
    for p in back:
        m.on_view(p.view)
    assert m.on_status(Status(2, "joining", 4, incarnation=2), 1.6) == [], "one view per new life"


def _root_coordinator(root_finishes_first: bool, round: int = 10) -> Membership:
    m = Membership(1, 2, View(1, [1, 2, 3], 2, 1, 5), root_finishes_first=root_finishes_first)
    for s in online(1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(round, 0.0)
    return m


def test_under_a_tree_whose_root_coordinates_joiners_are_in_from_the_next_round() -> None:
    """Nobody starts round 11 before the root's result of round 10, which leaves after the
    view: the joiners need not wait a round more (a site back from a cut took 6 rounds)."""
    m = _root_coordinator(True)
    out = m.on_status(Status(0, "joining", incarnation=1), 0.0)
    assert [(p.view.members, p.view.from_round) for p in out] == [([0, 1, 2, 3], 11)]
    # A second joiner in the same round is amended into it (one view for a site back).
    out = m.on_status(Status(4, "joining", incarnation=1), 0.0)
    assert [(p.view.members, p.view.from_round) for p in out] == [([0, 1, 2, 3, 4], 11)]


def test_without_a_root_that_finishes_first_joiners_wait_the_whole_lead() -> None:
    m = _root_coordinator(False)
    out = m.on_status(Status(0, "joining", incarnation=1), 0.0)
    assert [p.view.from_round for p in out] == [12]


def test_a_removal_keeps_the_whole_lead_under_a_root_that_finishes_first() -> None:
    m = _root_coordinator(True)
    out = m.on_status(Status(3, "offline"), 0.0)
    assert [(p.view.members, p.view.from_round) for p in out] == [([1, 2], 12)]
    # A joiner now is amended into that pending view, not ahead of it.
    out = m.on_status(Status(0, "joining", incarnation=1), 0.0)
    assert [(p.view.members, p.view.from_round) for p in out] == [([0, 1, 2], 12)]


def test_a_member_the_pending_view_drops_is_not_taken_back_a_round_sooner() -> None:
    """Node 3 was found silent and the view without it is pending; it speaks again a round
    later: its removal stands (the view taking it back is of its own, from round 13), not
    undone in the pending view of round 12."""
    m = _root_coordinator(True)
    out = m.on_suspect(Suspect(2, 10, 3), 0.0)
    assert [(p.view.members, p.view.from_round) for p in out] == [([1, 2], 12)]
    m.round_started(11, 0.0)
    out = m.on_status(Status(3, "online", round=11), 0.0)
    assert [(p.view.members, p.view.from_round) for p in out] == [([1, 2, 3], 13)]
    assert m.views.members_for(12) == (1, 2)


def test_only_the_root_of_the_round_under_way_counts_nobody_ahead() -> None:
    """Coordinator 1 of a newest view whose round under way still runs on node 0's tree (0
    went offline): a member may be a round ahead of us, so a joiner waits the whole lead."""
    m = Membership(1, 2, View(1, [0, 1, 2, 3], 2, 0, 5), root_finishes_first=True)
    for s in online(0, 1, 2, 3):
        m.on_status(s, 0.0)
    m.round_started(10, 0.0)
    assert m.front() == 11
    m.on_view(View(2, [0, 1, 2, 3], 2, 1, 10))  # now ours: our tree from round 10
    assert m.front() == 10
