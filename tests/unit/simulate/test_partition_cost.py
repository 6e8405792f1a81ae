"""`edgegrove analyze partition`: a partition's cost read from a run's events.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulate.partition_cost import add_arguments, partition_cost, run


def telemetry(node: int, rnd: int, t: float, members: int = 4, model_hash: str = "aa") -> dict[str, object]:
    return {"t": t, "type": "telemetry", "node": node, "round": rnd, "members": members, "model_hash": model_hash}


def write_run(path: Path) -> Path:
    """4 nodes; node 3 isolated in round 2 (its survivors' round takes 1.5 s, the next 0.9 s),
    healed at t = 8 (round 4 under way), back with one hash in round 7."""
    events: list[dict[str, object]] = [
        {"t": 0.0, "type": "fault", "action": "inject", "kind": "isolate", "round": 2, "targets": [3]}]
    t = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    spans = {0: 0.2, 1: 0.2, 2: 1.5, 3: 0.9, 4: 6.0, 5: 0.3, 6: 0.3, 7: 0.3, 8: 0.3}
    for rnd, span in spans.items():
        for node in range(4):
            if node == 3 and 2 <= rnd <= 6:
                continue  # cut off; back in round 7
            t[node] += span + 0.01 * node
            hashed = "bb" if node == 2 and rnd == 6 else "aa"  # not one hash until round 7
            events.append(telemetry(node, rnd, t[node], members=4 if rnd >= 6 else 3, model_hash=hashed))
    events.append({"t": 8.0, "type": "netns", "event": "healed", "node": 3})
    events.append({"t": 20.0, "type": "run", "phase": "end", "halted": False})
    events.sort(key=lambda e: float(e["t"]))  # type: ignore[arg-type]
    path.mkdir()
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_the_cut_rounds_time_and_the_rounds_from_the_heal_to_all_back(tmp_path: Path) -> None:
    cost = partition_cost(write_run(tmp_path / "run"))
    assert cost is not None and cost.isolated == [3] and cost.cut_round == 2
    # The slowest survivor (node 2: each node here is 0.01 s a round slower than the one before).
    assert cost.cut_round_s == pytest.approx(1.52) and cost.next_round_s == pytest.approx(0.92)
    assert (cost.heal_round, cost.whole_round, cost.rounds_to_whole) == (4, 7, 3)
    assert cost.halted is False


def test_a_directory_without_events_is_refused_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args([str(tmp_path)])) == 2
    assert "no events.jsonl" in capsys.readouterr().err
