"""Which devices a job goes to, and their node ids: a pure function of the retained records.

A device is assigned when the job's selector matches it, it is not offline and it lists the
job's data source (readable). The assigned devices, sorted by id, get node ids 0..n-1.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.jobs.document import DeviceRecord, Selector
from agent.jobs.states import DeviceState


class AssignError(ValueError):
    """Why a job cannot go out (one line): too few devices, no device with the data."""


@dataclass(frozen=True)
class Assignment:
    nodes: dict[str, int]  # device -> node id
    skipped: dict[str, str]  # matching device -> why it is left out (one phrase)


def assign(records: dict[str, DeviceRecord], selector: Selector, data: str,
           min_devices: int) -> Assignment:
    """The job's assignments, or AssignError when fewer than ``min_devices`` can take it."""
    unknown = [d for d in selector.devices or [] if d not in records]
    if unknown:
        raise AssignError(f"no enrolled device {', '.join(unknown)} (see `edgegrove devices`)")
    matching = sorted(d for d, r in records.items() if selector.matches(d, r.labels))
    if not matching:
        raise AssignError(f"no enrolled device matches {_said(selector)}")
    skipped = {d: why for d in matching if (why := _unfit(records[d], data))}
    chosen = [d for d in matching if d not in skipped]
    if not any(data in records[d].data for d in matching):
        raise AssignError(f"no device matching {_said(selector)} holds a data source {data!r}")
    if len(chosen) < min_devices:
        why = "; ".join(f"{d}: {w}" for d, w in skipped.items())
        raise AssignError(f"{len(chosen)} device{'s' if len(chosen) != 1 else ''} can take the job, "
                          f"fewer than min_devices {min_devices}" + (f" ({why})" if why else ""))
    return Assignment({d: node for node, d in enumerate(chosen)}, skipped)


def _unfit(record: DeviceRecord, data: str) -> str:
    if record.state == DeviceState.OFFLINE:
        return "offline"
    source = record.data.get(data)
    if source is None:
        return f"no data source {data}"
    if source.error:
        return f"data source {data} cannot be read ({source.error})"
    return ""


def _said(selector: Selector) -> str:
    if selector.devices is not None:
        return f"devices {', '.join(selector.devices)}"
    if selector.labels is not None:
        return "labels " + ", ".join(f"{k}={v}" for k, v in sorted(selector.labels.items()))
    return "all"
