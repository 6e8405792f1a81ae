"""The tail of one agent's log in a run directory (``agents/agent-N.log``, as the simulator
writes them), for the page's log panel. Only a node id chooses the file: no name from a
request reaches the file system, and a log that resolves outside the run's ``agents/``
directory (a symlink) is refused."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MAX_NODE = 1023  # node ids, as the message validation bounds them
MAX_TAIL_BYTES = 256 * 1024  # read at most this much of a log's end
MAX_LINE_CHARS = 2000


class LogUnavailable(LookupError):
    """No log to show: the dashboard has no run directory, or the node has no log in it."""


@dataclass(frozen=True)
class LogTail:
    node: int
    path: str  # relative to the run directory
    size: int  # the whole file's bytes
    lines: tuple[str, ...]
    truncated: bool  # earlier lines exist that are not in ``lines``


def log_path(run_dir: Path, node: int) -> Path:
    """Where the simulator writes node ``node``'s log. ValueError for an id no node has."""
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node <= MAX_NODE:
        raise ValueError(f"node {node!r}: a node id is 0-{MAX_NODE}")
    return run_dir / "agents" / f"agent-{node}.log"


def tail_log(run_dir: Path | None, node: int, lines: int) -> LogTail:
    """The last ``lines`` lines of the node's log (undecodable bytes replaced)."""
    if run_dir is None:
        raise LogUnavailable("this dashboard has no run directory: start it with --run-dir RUN_DIR "
                             "or --replay RUN_DIR to read agent logs")
    path = log_path(run_dir, node)
    agents = (run_dir / "agents").resolve()
    resolved = path.resolve()
    if resolved.parent != agents:
        raise LogUnavailable(f"node {node}'s log is outside the run directory's agents/")
    try:
        with open(resolved, "rb") as log:
            size = os.fstat(log.fileno()).st_size
            start = max(0, size - MAX_TAIL_BYTES)
            log.seek(start)
            data = log.read(MAX_TAIL_BYTES)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise LogUnavailable(f"node {node} has no log in {run_dir / 'agents'}") from None
    text = data.decode("utf-8", errors="replace").splitlines()
    if start > 0 and text:
        text = text[1:]  # the first line read is cut at the window's start
    kept = text[-lines:] if lines > 0 else []
    return LogTail(node=node, path=str(path.relative_to(run_dir)), size=size,
                   lines=tuple(line[:MAX_LINE_CHARS] for line in kept),
                   truncated=start > 0 or len(text) > len(kept))
