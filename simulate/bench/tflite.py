"""`edgegrove bench tflite --model FILE [FILE ...]`: what an agent's LiteRT model costs one
device. Each `.tflite` is loaded into ``TfliteModel`` (one interpreter, one thread, as the agent
does) in a child process of its own (``simulate.bench.tflite_step``, one at a time), which runs
``loss_and_grad`` on random batches of the model's input shape (--warmup untimed, then --steps
timed) and reports its peak resident memory (ru_maxrss: Python, numpy, the interpreter, the
model), the median seconds per batch and the file's size. ``--aarch64`` measures every file
again, in the same run, on a Raspberry Pi's architecture under qemu user-mode emulation
(scripts/arm64-env.sh; the agent installed from a wheel of this tree, or from --arm64-site),
qemu emulating a Raspberry Pi 4's core (Cortex-A72) with a Pi's /proc/cpuinfo, which LiteRT
needs under qemu (``simulate.bench.arm64.pi_cpu_userland``).

Under qemu the seconds are emulation time (every aarch64 instruction is translated on this
machine), not a Pi's; the peak resident memory is the qemu process's, guest and emulator
together, so an upper bound of what a Pi needs: that is the figure to read there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agent.validate import arg, input_file, positive_seconds, whole
from simulate.bench.arm64 import PI_CPU, Arm64Error, arm64_env, install_site, pi_cpu_userland
from simulate.bench.common import (
    REPO_ROOT,
    add_output_arguments,
    document,
    emit,
    format_table,
    progress,
)

DESCRIPTION = __doc__
STEP_MODULE = "simulate.bench.tflite_step"
NATIVE, AARCH64 = "native", "aarch64"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=arg(input_file), nargs="+", required=True, metavar="FILE",
                        help="the .tflite files to measure (written by `edgegrove model export`)")
    parser.add_argument("--batch", type=arg(whole(1, None, "a batch size")), default=16,
                        help="rows per loss_and_grad call (the agent's --batch)")
    parser.add_argument("--steps", type=arg(whole(1, None, "a number of batches")), default=10,
                        help="timed batches per file (the figure is their median)")
    parser.add_argument("--warmup", type=arg(whole(0, None, "a number of batches")), default=2,
                        help="untimed batches first")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batches")
    parser.add_argument("--aarch64", action="store_true",
                        help="also measure every file on aarch64 under qemu-user "
                             "(scripts/arm64-env.sh); its time is emulation time")
    parser.add_argument("--arm64-site", type=Path, default=None, metavar="DIR",
                        help="an aarch64 site made by `scripts/arm64-env.sh install DIR` "
                             "(default: install one into a temporary directory)")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=1800.0,
                        help="give up on one file's process after this many seconds")
    add_output_arguments(parser)


def step_arguments(model: Path, args: argparse.Namespace) -> list[str]:
    """The measured process's command line after ``python``."""
    return ["-m", STEP_MODULE, str(model.resolve()), "--batch", str(args.batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]


def measure_in_child(model: Path, args: argparse.Namespace, site: Path | None,
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """One file in a process of its own: this Python, or the aarch64 one from ``site`` (``env``:
    the environment of scripts/arm64-env.sh, from ``pi_cpu_userland``)."""
    where = NATIVE if site is None else AARCH64
    command = step_arguments(model, args)
    try:
        if site is None:
            path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
            done = subprocess.run([sys.executable, *command], capture_output=True, text=True,
                                  timeout=args.timeout, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONPATH": path}, check=False)
        else:
            done = arm64_env("python", str(site), *command, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"file": str(model), "where": where, "error": f"took over {args.timeout:.0f} s"}
    except Arm64Error as exc:
        return {"file": str(model), "where": where, "error": str(exc)}
    lines = done.stdout.strip().splitlines()
    try:
        if done.returncode != 0 or not lines:
            raise ValueError(f"exit {done.returncode}")
        result: dict[str, Any] = json.loads(lines[-1])
    except ValueError as exc:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"file": str(model), "where": where, "error": f"{exc}: {tail[0]}"}
    return {**result, "where": where}


def run(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-tflite-") as tmp:
        sites: list[Path | None] = [None]
        env: dict[str, str] | None = None
        if args.aarch64:
            try:
                if args.arm64_site is None:
                    progress("bench tflite: installing the agent for aarch64 (scripts/arm64-env.sh)...")
                sites.append(args.arm64_site or install_site(Path(tmp) / "arm64-site", data=False).path)
                env = pi_cpu_userland(Path(tmp) / "arm64")
            except Arm64Error as exc:
                print(f"bench tflite: {exc}", file=sys.stderr)
                return 1
        for site in sites:
            for model in args.model:
                progress(f"bench tflite: {model.name} on {NATIVE if site is None else AARCH64 + ' (qemu)'}, "
                         f"{args.warmup} + {args.steps} batches of {args.batch}...")
                results.append(measure_in_child(model, args, site, env))
    doc = document("tflite", batch=args.batch, steps=args.steps, warmup=args.warmup,
                   qemu_cpu=PI_CPU if args.aarch64 else None, results=results)
    emit(doc, args, table(results))
    return 1 if any("error" in r for r in results) else 0


def table(results: list[dict[str, Any]]) -> str:
    rows: list[list[Any]] = []
    errors = []
    for r in results:
        if "error" in r:
            errors.append(f"{Path(r['file']).name} on {r['where']}: error: {r['error']}")
            continue
        machine = r["machine"] + (" (qemu)" if r["where"] == AARCH64 else "")
        rows.append([Path(r["file"]).name, "yes" if r["batch_norm_train"] else "no", f"{r['file_bytes'] / 1e6:.2f}", machine,
                     f"{r['peak_rss_mb']:.1f}", f"{r['seconds_per_batch_median']:.3f}",
                     f"{r['seconds_per_batch_min']:.3f}", f"{r['seconds_per_batch_max']:.3f}",
                     f"{r['load_seconds']:.2f}"])
    headers = ["file", "train-mode BN", "file MB", "machine", "peak RSS MB", "s/batch median",
               "min", "max", "load s"]
    lines = [format_table(headers, rows)] if rows else []
    lines += errors
    if any(r["where"] == AARCH64 for r in results):
        lines.append(f"qemu rows ({PI_CPU}): the seconds are emulation time (each aarch64 instruction "
                     "translated on this machine), not a Raspberry Pi's; the peak RSS is the qemu "
                     "process's (guest and emulator), an upper bound for a Pi")
    return "\n".join(lines)
