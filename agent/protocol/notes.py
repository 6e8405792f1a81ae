"""The kinds of note an agent reports in telemetry: a closed set.

The report and the dashboard detect faults from these kinds, so a rename here is a rename
there; nothing outside this module spells a kind as a string.
"""

from __future__ import annotations

import enum


class NoteKind(enum.StrEnum):
    ABANDONED = "abandoned"
    ABSENT = "absent"
    BEHIND = "behind"
    CHUNKS = "chunks"
    DEADLINE_PUT_OFF = "deadline_put_off"
    DEGRADED = "degraded"
    DISCONNECTED = "disconnected"
    DISPLACED = "displaced"
    DRIFT = "drift"
    ESCALATE = "escalate"
    FAULT_INJECTED = "fault_injected"
    IMPLAUSIBLE = "implausible"
    INFLUENCE_BOUNDED = "influence_bounded"
    LIAR = "liar"  # a child's own contribution far beyond a member's bound, repeatedly: left out
    LINK_DEAD = "link_dead"
    LINK_HEALED = "link_healed"
    NACK = "nack"
    PULL = "pull"
    RECONNECTED = "reconnected"
    REJOIN = "rejoin"
    REJOIN_NEEDED = "rejoin_needed"
    RELAY = "relay"
    REROUTE = "reroute"
    RESTARTED = "restarted"
    RESYNC = "resync"
    ROOT_DOWN = "root_down"
    SILENT = "silent"
    STATE_BEYOND_FLEET = "state_beyond_fleet"
    STATE_PULL = "state_pull"
    STATE_PULL_FAILED = "state_pull_failed"
    STATE_RECEIVED = "state_received"
    STATE_REJECTED = "state_rejected"
    STATE_UNASKED = "state_unasked"
    STATE_UNVOUCHED = "state_unvouched"
    SUSPECTED = "suspected"
    SYNC_PERIOD = "sync_period"
    TIMEOUT = "timeout"
    UNDELIVERABLE = "undeliverable"


# The kinds an end of a link reports about the other end: evidence that the link failed.
LINK_EVIDENCE = frozenset({
    NoteKind.LINK_DEAD, NoteKind.REROUTE, NoteKind.TIMEOUT, NoteKind.PULL, NoteKind.RELAY,
    NoteKind.ESCALATE,
})
# Notes whose count the core keeps as rejected input.
REJECTED_STATE = frozenset({NoteKind.STATE_UNASKED, NoteKind.STATE_REJECTED, NoteKind.STATE_BEYOND_FLEET})
