"""Every MQTT topic of a job, in one place. Prefix default: ``edgegrove/<job>``."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_JOB_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_NODE_ID = 1023
_SITE_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
_ID_RE = re.compile(r"0|[1-9][0-9]{0,3}")  # ASCII digits, canonical (no leading zeros)


def validate_job(job: str) -> str:
    if not isinstance(job, str) or not _JOB_RE.fullmatch(job):
        raise ValueError(
            f"job name {job!r} is not valid: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return job


@dataclass(frozen=True)
class Topics:
    """Topic names for one job. ``prefix`` defaults to ``edgegrove/<job>``."""

    job: str
    prefix: str = ""

    def __post_init__(self) -> None:
        validate_job(self.job)
        if not self.prefix:
            object.__setattr__(self, "prefix", f"edgegrove/{self.job}")
        if any(c in self.prefix for c in "+#\0") or self.prefix.endswith("/"):
            raise ValueError(
                f"topic prefix {self.prefix!r} is not valid: no '+', '#', NUL or trailing '/'"
            )

    def link(self, src: int, dst: int) -> str:
        return f"{self.prefix}/link/{src}/{dst}"

    def links_to(self, dst: int) -> str:
        """Subscription filter for every frame addressed to ``dst``."""
        return f"{self.prefix}/link/+/{dst}"

    def fanout(self, node: int) -> str:
        """Where ``node``, as a round's root, publishes the round's result once for every
        member (``broadcast: fanout``); each agent may write only its own (ACL), so the
        publisher is known, and members accept a result there from their round's root only."""
        return f"{self.prefix}/fanout/{node}"

    def all_fanout(self) -> str:
        return f"{self.prefix}/fanout/+"

    def status(self, node: int) -> str:
        return f"{self.prefix}/status/{node}"

    def all_status(self) -> str:
        return f"{self.prefix}/status/+"

    def suspect(self, node: int) -> str:
        return f"{self.prefix}/suspect/{node}"

    def all_suspect(self) -> str:
        return f"{self.prefix}/suspect/+"

    @property
    def view(self) -> str:
        """The job-wide view topic of older versions (read by the dashboard's replays only)."""
        return f"{self.prefix}/view"

    def view_of(self, coordinator: int) -> str:
        """Where ``coordinator`` publishes its views: each agent may write only its own (ACL),
        so a view's publisher is known and a non-coordinator's view is rejected."""
        return f"{self.prefix}/view/{coordinator}"

    def all_views(self) -> str:
        return f"{self.prefix}/view/+"

    def state(self, node: int) -> str:
        """Where ``node`` announces the digest of its training state for a round (retained):
        a joiner installs only a state the coordinator or a majority announced."""
        return f"{self.prefix}/state/{node}"

    def all_states(self) -> str:
        return f"{self.prefix}/state/+"

    def telemetry(self, node: int) -> str:
        return f"{self.prefix}/telemetry/{node}"

    def all_telemetry(self) -> str:
        return f"{self.prefix}/telemetry/+"

    def bridge(self, site: str) -> str:
        """Where a site's broker and the core broker say whether that site's bridge is up
        ("1") or down ("0"): mosquitto's bridge notifications (broker-config/make-sites)."""
        return f"{self.prefix}/bridge/{site}"

    def all_bridges(self) -> str:
        return f"{self.prefix}/bridge/+"

    def parse_bridge(self, topic: str) -> str | None:
        head = f"{self.prefix}/bridge/"
        site = topic[len(head):] if topic.startswith(head) else ""
        return site if _SITE_RE.fullmatch(site) else None

    @property
    def control(self) -> str:
        return f"{self.prefix}/control"

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - every frame's topic is parsed; Topics is frozen
    def parse_link(self, topic: str) -> tuple[int, int] | None:
        """(src, dst) of a link topic of this job, None for anything else."""
        return self._ints(topic, "link", 2)  # type: ignore[return-value]

    def parse_fanout(self, topic: str) -> int | None:
        """The publisher of a fan-out topic of this job, None for anything else."""
        ids = self._ints(topic, "fanout", 1)
        return None if ids is None else ids[0]

    def parse_status(self, topic: str) -> int | None:
        ids = self._ints(topic, "status", 1)
        return None if ids is None else ids[0]

    def parse_view(self, topic: str) -> int | None:
        """The publisher of a view topic (its coordinator), None for anything else."""
        ids = self._ints(topic, "view", 1)
        return None if ids is None else ids[0]

    def is_view(self, topic: str) -> bool:
        return topic == self.view or self.parse_view(topic) is not None

    def parse_suspect(self, topic: str) -> int | None:
        ids = self._ints(topic, "suspect", 1)
        return None if ids is None else ids[0]

    def parse_state(self, topic: str) -> int | None:
        ids = self._ints(topic, "state", 1)
        return None if ids is None else ids[0]

    def parse_telemetry(self, topic: str) -> int | None:
        ids = self._ints(topic, "telemetry", 1)
        return None if ids is None else ids[0]

    def _ints(self, topic: str, kind: str, count: int) -> tuple[int, ...] | None:
        head = f"{self.prefix}/{kind}/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head):].split("/")
        if len(parts) != count or not all(_ID_RE.fullmatch(p) for p in parts):
            return None
        ids = tuple(int(p) for p in parts)
        return ids if all(i <= MAX_NODE_ID for i in ids) else None
