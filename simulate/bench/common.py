"""Helpers shared by the benchmarks: options, tables, the JSON document, machine facts.

Every bench prints either a human table (stdout) or, with ``--json``, exactly one JSON
document on stdout; progress goes to stderr. ``--out PATH`` also writes the document to a
file (``docs/results/<bench>.json`` is what ``edgegrove bench report`` reads). Documents
carry ``benchmark`` (their name) and ``machine`` (where they were measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.validate import arg, output_file

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "docs" / "results"


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--out``, the same in every bench."""
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON document on stdout (progress goes to stderr)")
    parser.add_argument("--out", type=arg(output_file), default=None, metavar="PATH",
                        help="also write the JSON document to PATH (e.g. docs/results/<bench>.json, "
                             "which `edgegrove bench report` reads)")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def mosquitto_version() -> str | None:
    """``mosquitto -h`` prints "mosquitto version X.Y.Z" on its first line (and exits 3)."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (done.stdout + done.stderr).splitlines():
        if "version" in line:
            return line.split("version", 1)[1].strip()
    return None


def machine_info() -> dict[str, Any]:
    """Where a figure was measured: CPU, cores, Python, mosquitto, kernel, date (UTC)."""
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "mosquitto": mosquitto_version(),
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def document(benchmark: str, **fields: Any) -> dict[str, Any]:
    """The JSON document of one bench run: its name, the machine, then its own fields."""
    return {"benchmark": benchmark, "machine": machine_info(), **fields}


def emit(doc: dict[str, Any], args: argparse.Namespace, table: str) -> None:
    """Print the table or the JSON document; write the document to ``--out`` if asked."""
    out: Path | None = getattr(args, "out", None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        progress(f"wrote {out}")
    if getattr(args, "json", False):
        print(json.dumps(doc))
    else:
        print(table)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths, strict=True)))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths)] + [line(r) for r in cells])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The same table in GitHub markdown (first column left, others right)."""
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of repeated measurements (empty input: an error, not a NaN)."""
    if not values:
        raise ValueError("no measurements to summarize")
    return {
        "median": float(statistics.median(values)),
        "p10": float(np.percentile(values, 10)),
        "p90": float(np.percentile(values, 90)),
        "min": float(min(values)),
        "max": float(max(values)),
        "n": len(values),
    }
