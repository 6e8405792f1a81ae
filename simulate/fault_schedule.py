"""When a scenario's faults fire and heal: each fault's slot moves pending -> (armed ->) active
-> done, or skipped, as the fleet's round passes its rounds. The injector does the harm."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from simulate.injector import Injector, Plan
from simulate.progress import say
from simulate.telemetry import EventLog, FleetWatch

MID_ROUND_WAIT_S = 0.5  # s: the longest the run's loop sleeps between two looks at the faults


@dataclass
class FaultSlot:
    index: int
    fault: Any
    plan: Plan
    state: str = "pending"  # pending | armed (mid phase) | active | done | skipped
    fire_at: float | None = None


class FaultSchedule:
    """The scenario's faults, each with its plan (how it is done, or why it is skipped)."""

    def __init__(self, faults: list[Any], plans: list[Plan], log: EventLog, watch: FleetWatch) -> None:
        self.log = log
        self.watch = watch  # a mid-round fault fires half the fleet's median round in
        self.slots = [FaultSlot(i, f, p) for i, (f, p) in enumerate(zip(faults, plans, strict=True))]
        for slot in self.slots:
            log.add("fault", action="plan", index=slot.index, kind=slot.fault.kind,
                    description=slot.fault.describe(), mechanism=slot.plan.mechanism,
                    targets=list(slot.fault.targets))
            if slot.plan.skip:
                slot.state = "skipped"
                log.add("fault", action="skip", index=slot.index, kind=slot.fault.kind, detail=slot.plan.skip)
                say(f"simulate: skipping fault {slot.index} ({slot.fault.describe()}): {slot.plan.skip}")

    @property
    def injected(self) -> int:
        return sum(1 for s in self.slots if s.state in ("active", "done"))

    def fire(self, fleet_round: int, injector: Injector) -> None:
        """Inject what the fleet's round has reached (a mid-round fault half a round later),
        heal what is over."""
        now = time.monotonic()
        for slot in self.slots:
            fault = slot.fault
            if slot.state == "pending" and fleet_round >= fault.at_round:
                if fault.phase == "mid":
                    median = self.watch.median_round_seconds() or 0.2
                    slot.state, slot.fire_at = "armed", now + 0.5 * median
                else:
                    self._apply(slot, fleet_round, injector)
            if slot.state == "armed" and slot.fire_at is not None and now >= slot.fire_at:
                self._apply(slot, fleet_round, injector)
            if slot.state == "active" and injector.finished(fault):
                slot.state = "done"
                self.log.add("fault", action="heal", index=slot.index, kind=fault.kind, round=fleet_round)
                say(f"simulate: round {fleet_round}: fault {slot.index} is over ({fault.describe()})")
            end = fault.end_round
            if slot.state == "active" and end is not None and fleet_round >= end:
                injector.undo(fault, slot.plan)
                slot.state = "done"
                self.log.add("fault", action="heal", index=slot.index, kind=fault.kind, round=fleet_round)
                say(f"simulate: round {fleet_round}: undone fault {slot.index} ({fault.describe()})")

    def _apply(self, slot: FaultSlot, fleet_round: int, injector: Injector) -> None:
        try:
            injector.inject(slot.fault, slot.plan)
        except (OSError, RuntimeError, KeyError) as exc:
            slot.state = "skipped"
            self.log.add("fault", action="skip", index=slot.index, kind=slot.fault.kind, detail=str(exc))
            say(f"simulate: fault {slot.index} could not be injected: {exc}")
            return
        slot.state = "active"
        self.log.add("fault", action="inject", index=slot.index, kind=slot.fault.kind, round=fleet_round,
                     description=slot.fault.describe(), mechanism=slot.plan.mechanism,
                     targets=list(slot.fault.targets))
        say(f"simulate: round {fleet_round}: injected fault {slot.index} ({slot.fault.describe()}, "
            f"{slot.plan.mechanism})")

    def next_wait(self) -> float:
        """How long the run's loop may sleep: until the next armed fault, at most MID_ROUND_WAIT_S."""
        armed = [s.fire_at for s in self.slots if s.state == "armed" and s.fire_at is not None]
        wait = MID_ROUND_WAIT_S
        if armed:
            wait = min(wait, max(0.0, min(armed) - time.monotonic()))
        return wait

    def restart_pending(self, rounds: int) -> bool:
        """A crashed agent is still to be restarted before the run's last round."""
        return any(s.state == "active" and s.fault.kind == "crash" and s.fault.end_round is not None
                   and s.fault.end_round < rounds for s in self.slots)
