"""`edgegrove bench tflite --model MODEL [MODEL ...]`: what an agent's model costs one device.
A MODEL is a `.tflite` file, loaded into ``TfliteModel`` (one interpreter, one thread, as the
agent does), or a Python-path spec, ``path/to/model.py:factory`` (e.g. the PyTorch adapter's
examples/torch_cnn/model.py:factory), loaded as agents load it (``agent.model.loader``). Each is
loaded in a child process of its own (``simulate.bench.tflite_step``, one at a time), which runs
``loss_and_grad`` on random batches of the model's input shape (--warmup untimed, then --steps
timed) and reports its peak resident memory (ru_maxrss: Python, numpy, the runtime, the model),
the median seconds per batch and the .tflite file's size. ``--aarch64`` measures every model
again, in the same run, on a Raspberry Pi's architecture under qemu user-mode emulation
(scripts/arm64-env.sh; the agent installed from a wheel of this tree, with torch when a model is
a Python spec, or from --arm64-site), qemu emulating a Raspberry Pi 4's core (Cortex-A72; --qemu-cpu
cortex-a76: a Pi 5's, or both) with that Pi's /proc/cpuinfo, which LiteRT needs under qemu
(``simulate.bench.arm64.pi_cpu_userland``).
The aarch64 torch is PyPI's last CPU build (scripts/arm64-env.sh, TORCH_VERSION), not
necessarily this machine's version: the table's runtime column says which.

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

from agent.validate import UsageError, arg, input_file, positive_seconds, whole
from simulate.bench.arm64 import (
    PI_CORES,
    PI_CPU,
    Arm64Error,
    arm64_env,
    install_site,
    pi_cpu_userland,
)
from simulate.bench.common import (
    REPO_ROOT,
    add_output_arguments,
    document,
    emit,
    format_table,
    progress,
)
from simulate.bench.tflite_step import is_tflite

DESCRIPTION = __doc__
STEP_MODULE = "simulate.bench.tflite_step"
NATIVE, AARCH64 = "native", "aarch64"


def model_spec(text: str) -> str:
    """A .tflite file or ``path/to/model.py:factory``, made absolute (the child runs elsewhere)."""
    if is_tflite(text):
        return str(input_file(text).resolve())
    where, colon, factory = text.rpartition(":")
    if not colon or not where.endswith(".py") or not factory.isidentifier():
        raise UsageError(f"{text!r}: give a .tflite file or path/to/model.py:factory")
    return f"{input_file(where).resolve()}:{factory}"


def label(spec: str) -> str:
    """A model's name in the table: the file's, and a Python spec's folder with it."""
    return Path(spec).name if is_tflite(spec) else f"{Path(spec).parent.name}/{Path(spec).name}"


def is_python(spec: str) -> bool:
    return not is_tflite(spec)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=arg(model_spec), nargs="+", required=True, metavar="MODEL",
                        help="the models to measure: .tflite files (written by `edgegrove model "
                             "export`) or Python-path specs path/to/model.py:factory, loaded as "
                             "an agent loads them (e.g. examples/torch_cnn/model.py:factory)")
    parser.add_argument("--batch", type=arg(whole(1, None, "a batch size")), default=16,
                        help="rows per loss_and_grad call (the agent's --batch)")
    parser.add_argument("--steps", type=arg(whole(1, None, "a number of batches")), default=10,
                        help="timed batches per model (the figure is their median)")
    parser.add_argument("--warmup", type=arg(whole(0, None, "a number of batches")), default=2,
                        help="untimed batches first")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batches")
    parser.add_argument("--aarch64", action="store_true",
                        help="also measure every model on aarch64 under qemu-user "
                             "(scripts/arm64-env.sh); its time is emulation time")
    parser.add_argument("--arm64-site", type=Path, default=None, metavar="DIR",
                        help="an aarch64 site made by `scripts/arm64-env.sh install DIR` "
                             "(and `scripts/arm64-env.sh torch DIR` for a PyTorch model; "
                             "default: install one into a temporary directory)")
    parser.add_argument("--qemu-cpu", nargs="+", choices=sorted(PI_CORES), default=[PI_CPU],
                        metavar="CORE",
                        help="with --aarch64: the cores qemu emulates, each with its Pi's "
                             "/proc/cpuinfo, one row each: cortex-a72 (a Pi 4, ARMv8.0-A, the "
                             "default), cortex-a76 (a Pi 5, ARMv8.2-A)")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=1800.0,
                        help="give up on one model's process after this many seconds")
    add_output_arguments(parser)


def step_arguments(model: str, args: argparse.Namespace) -> list[str]:
    """The measured process's command line after ``python``."""
    return ["-m", STEP_MODULE, model, "--batch", str(args.batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]


def measure_in_child(model: str, args: argparse.Namespace, site: Path | None,
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """One model in a process of its own: this Python, or the aarch64 one from ``site`` (``env``:
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
        return {"file": model, "where": where, "error": f"took over {args.timeout:.0f} s"}
    except Arm64Error as exc:
        return {"file": model, "where": where, "error": str(exc)}
    lines = done.stdout.strip().splitlines()
    try:
        if done.returncode != 0 or not lines:
            raise ValueError(f"exit {done.returncode}")
        result: dict[str, Any] = json.loads(lines[-1])
    except ValueError as exc:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"file": model, "where": where, "error": f"{exc}: {tail[0]}"}
    return {**result, "where": where}


def run(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-tflite-") as tmp:
        # (site, the environment of scripts/arm64-env.sh, qemu's core): this Python first.
        runs: list[tuple[Path | None, dict[str, str] | None, str | None]] = [(None, None, None)]
        if args.aarch64:
            try:
                if args.arm64_site is None:
                    progress("bench tflite: installing the agent for aarch64 (scripts/arm64-env.sh)...")
                torch = any(is_python(m) for m in args.model)
                if args.arm64_site is None and torch:
                    progress("bench tflite: adding torch for aarch64 (scripts/arm64-env.sh torch)...")
                site = args.arm64_site or install_site(Path(tmp) / "arm64-site", data=False,
                                                       torch=torch).path
                runs += [(site, pi_cpu_userland(Path(tmp) / f"arm64-{core}", core), core)
                         for core in args.qemu_cpu]
            except Arm64Error as exc:
                print(f"bench tflite: {exc}", file=sys.stderr)
                return 1
        for site, env, core in runs:
            for model in args.model:
                progress(f"bench tflite: {label(model)} on {NATIVE if site is None else f'{AARCH64} (qemu {core})'}, "
                         f"{args.warmup} + {args.steps} batches of {args.batch}...")
                result = measure_in_child(model, args, site, env)
                results.append(result if core is None else {**result, "qemu_cpu": core})
    doc = document("tflite", batch=args.batch, steps=args.steps, warmup=args.warmup,
                   qemu_cpu=" ".join(args.qemu_cpu) if args.aarch64 else None, results=results)
    emit(doc, args, table(results))
    return 1 if any("error" in r for r in results) else 0


def table(results: list[dict[str, Any]]) -> str:
    rows: list[list[Any]] = []
    errors = []
    for r in results:
        if "error" in r:
            where = r["where"] + (f" (qemu {r['qemu_cpu']})" if "qemu_cpu" in r else "")
            errors.append(f"{label(r['file'])} on {where}: error: {r['error']}")
            continue
        machine = r["machine"] + (f" (qemu {r.get('qemu_cpu', PI_CPU)})" if r["where"] == AARCH64 else "")
        size = "-" if r.get("file_bytes") is None else f"{r['file_bytes'] / 1e6:.2f}"
        # Documents written before Python-path models had no runtime: they were all LiteRT's.
        name, version = r.get("runtime", "litert"), r.get("runtime_version", r.get("litert"))
        rows.append([label(r["file"]), f"{name} {version or '?'}",
                     "yes" if r["batch_norm_train"] else "no", size, machine,
                     f"{r['peak_rss_mb']:.1f}", f"{r['rss_before_model_mb']:.1f}",
                     f"{r['seconds_per_batch_median']:.3f}", f"{r['seconds_per_batch_min']:.3f}",
                     f"{r['seconds_per_batch_max']:.3f}", f"{r['load_seconds']:.2f}"])
    headers = ["model", "runtime", "train-mode BN", "file MB", "machine", "peak RSS MB",
               "RSS before model", "s/batch median", "min", "max", "load s"]
    lines = [format_table(headers, rows)] if rows else []
    lines += errors
    if any(r["where"] == AARCH64 for r in results):
        lines.append("qemu rows: the seconds are emulation time (each aarch64 instruction "
                     "translated on this machine), not a Raspberry Pi's; the peak RSS is the qemu "
                     "process's (guest and emulator), an upper bound for a Pi")
    return "\n".join(lines)
