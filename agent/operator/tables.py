"""Plain-text tables and the short forms the operator's commands print."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from agent.jobs.document import ExecStatus, JobSpec


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [headers, *rows]]
    return "\n".join(lines)


def ago(then: float, now: float) -> str:
    if then <= 0:
        return "-"
    seconds = max(0.0, now - then)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def states_summary(spec: JobSpec | None, execs: dict[str, ExecStatus]) -> str:
    """'training 4, rejected 1' (devices assigned but silent count as 'no state')."""
    counts = Counter(str(s.state) for s in execs.values())
    if spec is not None:
        silent = [d for d in spec.assignments if d not in execs]
        if silent:
            counts["no state"] += len(silent)
    return ", ".join(f"{state} {n}" for state, n in sorted(counts.items())) or "-"


def last_round(execs: dict[str, ExecStatus]) -> tuple[int | None, float | None]:
    """The furthest round any device reported, and the latest accuracy reported."""
    rounds = [s.round for s in execs.values() if s.round is not None]
    with_accuracy = sorted((s for s in execs.values() if s.accuracy is not None),
                           key=lambda s: (s.round or 0, s.updated_at))
    return (max(rounds) if rounds else None,
            with_accuracy[-1].accuracy if with_accuracy else None)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"
