"""A liar at a leaf and at an inner node of a real 4-agent fleet on dynamic-security mosquitto,
from its own credentials (issue 54.2): its parent takes its contribution apart (audit copies),
bounds it as one member's, and leaves it out once it lied in several rounds; the fleet then
learns as the clean one does.

Node 1 is inner (its child is node 3), node 3 a leaf under it. Each attack runs ROUNDS rounds
against the clean run of the same fleet (accuracy on the whole test set after the last
round). The full matrix (4 and 7 agents, x-3 and x-10, own gradient and whole unit, more
rounds) is the benchmark ``python -m tests.integration.attacks.liars_fleet`` (docs/SECURITY.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.protocol.plausibility import FLAG_ROUNDS
from agent.protocol.wire import RejectReason
from tests.integration.attacks.liars_fleet import INNER, LEAF, Run, run_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NODES = 4
ROUNDS = 40
ACCURACY_PP = 1.0  # the bound against the clean run at the same round
# A liar is left out by the round its record convicts it at the latest (every round counted
# against it), plus a round of slack for a round its parent missed.
LEFT_OUT_BY = FLAG_ROUNDS + 1


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = run_fleet(tmp_path_factory.mktemp("clean"), NODES, ROUNDS)
    assert run.left_out == {} and not any(run.own_parts(n) for n in range(NODES)), run.rejected
    return run


@pytest.mark.parametrize(("liar", "attack"), [(INNER, "unit:-3"), (INNER, "own:-10"), (LEAF, "own:-10")],
                         ids=["inner-whole-unit-x-3", "inner-own-gradient-x-10", "leaf-x-10"])
def test_a_liar_is_left_out_by_its_parent_and_the_fleet_learns_as_the_clean_one(
    liar: int, attack: str, clean: Run, tmp_path: Path
) -> None:
    run = run_fleet(tmp_path, NODES, ROUNDS, liar, attack)
    parent = 0 if liar == INNER else INNER
    print(f"liar {liar} {attack}: accuracy {run.accuracy:.4f} against {clean.accuracy:.4f} clean after "
          f"{ROUNDS} rounds; left out {run.left_out}; parent {parent} refused {run.rejected[parent]}")
    assert set(run.left_out) == {liar} and run.left_out[liar][0] == parent, run.left_out
    assert run.left_out[liar][1] <= LEFT_OUT_BY, run.left_out
    assert run.rejected[parent].get(RejectReason.LIAR_LEFT_OUT) == 1  # counted once
    if liar == INNER:
        assert run.own_parts(parent) >= 1, run.rejected  # taken apart, not bounded as a whole
    # No split, no halt: every member in every view, one model at the end.
    assert len(run.hashes) == NODES and len(set(run.hashes.values())) == 1, run.hashes
    assert all(m == NODES for m in run.members), run.members
    assert abs(run.accuracy - clean.accuracy) * 100 <= ACCURACY_PP, (run.accuracy, clean.accuracy)


def test_a_liar_at_the_bound_inside_the_tree_weighs_one_member(clean: Run, tmp_path: Path) -> None:
    """Node 1 sends its own gradient x-3 merged with its child's honest unit: its own part sits
    at a member's bound. Without the audit it spent its subtree's budget (60 rounds: 0.157
    against 0.923 clean, chance); now the root takes the unit apart and clips the own part as
    a leaf's (a leaf doing the same: 0.434 after 60 rounds). Being at the bound flags nobody
    (an honest non-IID leaf is there too), so it is not left out."""
    run = run_fleet(tmp_path, NODES, ROUNDS, INNER, "own:-3")
    print(f"liar {INNER} own:-3: accuracy {run.accuracy:.4f} against {clean.accuracy:.4f} clean after {ROUNDS} "
          f"rounds; left out {run.left_out}; root refused {run.rejected[0]}")
    assert run.rejected[0].get(RejectReason.OWN_PART_CLIPPED, 0) >= ROUNDS // 2, run.rejected
    assert run.left_out == {} and len(set(run.hashes.values())) == 1, (run.left_out, run.hashes)
