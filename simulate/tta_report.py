"""The time-to-accuracy section of docs/EVALUATION.md (`edgegrove bench tta`): its table and
its verdicts, from docs/results/tta.json. Pure: no plotting, no files."""

from __future__ import annotations

from typing import Any

HEADERS = ["link MB/s", "sync every", "local steps", "rounds run", "round reached", "s to target",
           "MB sent to target", "samples to target", "round s (median)", "final acc", "acc after H=1's samples"]
SPEEDUP_BOUND = 5.0  # issue 39: auto at least this much faster than every-step averaging
LOOPBACK_SLACK = 1.10  # on unlimited loopback auto may be at most 10 % slower
ACCURACY_PP = 0.5  # the same data, at most this far apart


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _link(rate: float) -> str:
    return "unlimited" if rate == 0 else f"{rate:g}"


def _link_name(rate: float) -> str:
    return "unlimited loopback" if rate == 0 else f"{rate:g} MB/s"


def _between(result: dict[str, Any]) -> str:
    """The two evaluations an interpolated accuracy lies between, when they are not one."""
    before, after = result.get("matched_between") or (None, None)
    if not before or not after or before[0] == after[0]:
        return ""
    return f" ({_pct(before[1])} at {before[0]:,} .. {_pct(after[1])} at {after[0]:,} samples)"


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in doc["results"]:
        matched = r.get("accuracy_at_matched")
        after = "-" if matched is None else f"{_pct(matched)}{_between(r)}"
        rows.append([_link(r["link_mbs"]), r["sync_every"], r["local_steps"], r.get("rounds", "-"),
                     r["round_reached"] if r["round_reached"] is not None else "not reached",
                     r["seconds"] if r["seconds"] is not None else "-", r["megabytes_sent"] or "-",
                     f"{r['samples']:,}" if r["samples"] else "-",
                     f"{r['median_round_s']:.3f}" if r.get("median_round_s") is not None else "-",
                     _pct(r["final_accuracy"]), after])
    return rows


def verdicts(doc: dict[str, Any], compared: str = "auto") -> list[str]:
    """Per link rate: ``compared`` against every-step averaging, in time and in accuracy for the
    same data, each marked met or missed against issue 39's bounds."""
    out = []
    for rate in dict.fromkeys(r["link_mbs"] for r in doc["results"]):
        at = {r["sync_every"]: r for r in doc["results"] if r["link_mbs"] == rate}
        every, other = at.get("1"), at.get(compared)
        if every is None or other is None:
            continue
        if not every["seconds"] or not other["seconds"]:
            out.append(f"- {_link_name(rate)}: a run did not reach the target; no ratio.")
            continue
        ratio = every["seconds"] / other["seconds"]
        bound_ok = ratio * LOOPBACK_SLACK >= 1.0 if rate == 0 else ratio >= SPEEDUP_BOUND
        bound = "never more than 10 % slower" if rate == 0 else f"at least {SPEEDUP_BOUND:g}x faster"
        line = (f"- {_link_name(rate)}: sync-every {compared} reached the target in {other['seconds']} s against "
                f"{every['seconds']} s every step: **{ratio:.1f}x** ({'met' if bound_ok else 'missed'}: {bound}); "
                f"{other['megabytes_sent']} MB sent against {every['megabytes_sent']} MB")
        a, b = every.get("accuracy_at_matched"), other.get("accuracy_at_matched")
        if a is not None and b is not None:
            gap = 100 * (b - a)
            line += (f"; after the same data, {every['matched_samples']:,} samples: {_pct(b)}{_between(other)} "
                     f"against {_pct(a)}, {gap:+.2f} pp ({'met' if abs(gap) <= ACCURACY_PP else 'missed'}: "
                     f"within {ACCURACY_PP} pp)")
        out.append(line + ".")
    return out
