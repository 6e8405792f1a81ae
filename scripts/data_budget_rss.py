#!/usr/bin/env python3
"""Peak resident memory of `edgegrove agent --data BIG.csv`, before and after the data budget
(issue 54): a generated MNIST-like CSV (label + 784 pixel columns, mostly zeros) in a temporary
directory, deleted at the end.

    PYTHONPATH=$PWD .venv/bin/python scripts/data_budget_rss.py --mb 400 --before-root /work/main

For each run: its exit code, its peak RSS (the child's ru_maxrss) and its last stderr line.
"before" runs the code at --before-root (the agent loads the whole file, then fails to reach
the broker), "after" this tree's: with --data-max-mb it refuses the file before reading it;
without it the file fits this machine's memory and is loaded by the streaming reader.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROWS_PER_BLOCK = 2000
HERE = Path(__file__).resolve().parent.parent


def write_csv(path: Path, megabytes: float) -> int:
    """Rows of MNIST-like samples until the file holds ``megabytes``; returns the rows."""
    rng = np.random.default_rng(0)
    rows = 0
    with path.open("w") as f:
        f.write("label," + ",".join(f"p{i}" for i in range(784)) + "\n")
        while f.tell() < megabytes * 2**20:
            pixels = rng.integers(0, 256, (ROWS_PER_BLOCK, 784)) * (rng.random((ROWS_PER_BLOCK, 784)) < 0.2)
            block = np.column_stack([rng.integers(0, 10, ROWS_PER_BLOCK), pixels])
            np.savetxt(f, block, fmt="%d", delimiter=",")
            rows += ROWS_PER_BLOCK
    return rows


def run(root: Path, data: Path, extra: list[str]) -> tuple[int, float, str]:
    """(exit code, peak RSS in MB, last stderr line) of one agent run from ``root``'s code."""
    env = {**os.environ, "PYTHONPATH": str(root), "OPENBLAS_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "edgegrove.cli", "agent", "--id", "0", "--job", "rss",
            "--broker", "mqtt://127.0.0.1:9", "--data", str(data), "--rounds", "1", *extra]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        lines = [line for line in err.read().splitlines() if line.strip()]
    return proc.returncode, usage.ru_maxrss / 1024, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=400, help="size of the generated CSV (MB)")
    parser.add_argument("--before-root", type=Path, required=True, help="a checkout of the code before")
    parser.add_argument("--cap-mb", type=float, default=256, help="--data-max-mb of the refused run")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="data-budget-rss-"))
    try:
        data = tmp / "big.csv"
        rows = write_csv(data, args.mb)
        print(f"generated {data.stat().st_size / 2**20:.0f} MB CSV, {rows} rows x 785 columns "
              f"(parsed: {rows * (784 * 4 + 8) / 2**20:.0f} MB of float32 + int64)")
        runs = [("before", args.before_root, []),
                ("after, loaded (fits this machine)", HERE, []),
                (f"after, --data-max-mb {args.cap_mb:g}", HERE, ["--data-max-mb", str(args.cap_mb)])]
        for name, root, extra in runs:
            code, peak, last = run(root, data, extra)
            print(f"{name}: exit {code}, peak RSS {peak:.0f} MB; stderr: {last[:240]}")
    finally:
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
