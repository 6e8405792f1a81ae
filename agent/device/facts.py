"""What the device tells about itself: the machine, its backends, its data (IO, read once)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.device.config import DeviceConfig
from agent.device.core import Summary
from agent.jobs.document import DataSourceInfo, DeviceRecord
from agent.jobs.states import DeviceState

log = logging.getLogger("edgegrove.device")
MEMINFO = "/proc/meminfo"
SUMMARY_FILE = "data-summary.json"
SUMMARY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Facts:
    """The static part of the device record."""

    arch: str
    cores: int
    memory: int
    backends: list[str]
    data: dict[str, DataSourceInfo]
    version: str
    started_at: float


def gather(config: DeviceConfig, now: float) -> Facts:
    return Facts(platform.machine(), os.cpu_count() or 1, meminfo("MemTotal"),
                 usable_backends(config.backends), summarize_sources(config), version(), now)


def record(config: DeviceConfig, facts: Facts, summary: Summary | None, now: float) -> DeviceRecord:
    """The device record; ``summary`` None: the offline record of the Will."""
    live = summary is not None
    return DeviceRecord(
        id=config.id, labels=config.labels, arch=facts.arch, cores=facts.cores, memory=facts.memory,
        memory_available=meminfo("MemAvailable") if live else 0, backends=facts.backends,
        data=facts.data, version=facts.version,
        state=summary.state if summary else DeviceState.OFFLINE,
        job=summary.job if summary else None, node=summary.node if summary else None,
        queued=summary.queued if summary else [], last_seen=now, started_at=facts.started_at,
        refused=summary.refused if summary else {}, public_key=config.device_public_key or "")


def meminfo(field: str, path: str = MEMINFO) -> int:
    """A /proc/meminfo field in bytes (0: unknown)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == field:
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def usable_backends(allowed: Sequence[str]) -> list[str]:
    """numpy always; litert when its package is installed (found, not imported: memory)."""
    found = ["numpy"] + (["litert"] if importlib.util.find_spec("ai_edge_litert") else [])
    return [b for b in found if b in allowed]


def version() -> str:
    try:
        return importlib.metadata.version("edgegrove")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def summarize_sources(config: DeviceConfig) -> dict[str, DataSourceInfo]:
    """Each data source's sample count and label histogram, cached by the source's identity."""
    cache_file = config.state_dir / SUMMARY_FILE
    cache = _read_json(cache_file)
    keys = {name: _source_key(name, config) for name in config.data}
    missing = {name: config.data[name] for name, key in keys.items() if key not in cache}
    if missing:
        request = {name: {"format": s.format, "path": str(s.path) if s.path else None,
                          "label_column": s.label_column} for name, s in missing.items()}
        answered = _run_summary(request)
        cache.update({keys[name]: answered.get(name, _failed(s.format)) for name, s in missing.items()})
        _write_json(cache_file, {k: v for k, v in cache.items() if k in keys.values()})
    return {name: DataSourceInfo.model_validate(cache[key]) for name, key in keys.items()}


def _source_key(name: str, config: DeviceConfig) -> str:
    source = config.data[name]
    stamp = ""
    if source.path is not None and source.path.exists():
        st = source.path.stat()
        stamp = f"{st.st_mtime_ns}:{st.st_size}"
    text = f"{source.format}|{source.path}|{source.label_column}|{stamp}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _run_summary(request: dict[str, dict[str, str | None]]) -> dict[str, dict[str, object]]:
    try:
        done = subprocess.run([sys.executable, "-m", "agent.device.datasummary"],
                              input=json.dumps(request), capture_output=True, text=True,
                              timeout=SUMMARY_TIMEOUT_S, check=False)
        answer = json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("cannot count the data sources: %s", exc)
        return {}
    if done.returncode != 0:
        log.warning("cannot count the data sources: %s", done.stderr.strip().splitlines()[-1:])
    return answer if isinstance(answer, dict) else {}


def _failed(fmt: str) -> dict[str, object]:
    return {"format": fmt, "samples": 0, "labels": [], "error": "could not be counted"}


def _read_json(path: Path) -> dict[str, dict[str, object]]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(value, indent=1))
    temp.replace(path)
