"""`edgegrove bench model`: per-step time and peak memory of the numpy and litert backends.

Each backend is measured in its own child process (started in the same run, one after the
other), so that its peak resident memory is its own: a step is gradients() on a batch plus
apply() (the optimizer), on random pixels (the arithmetic does not depend on the values).
Figures: median / p90 ms per step and of each half, backend creation time, peak RSS and its
increase over the process before the backend existed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np

from agent.model.backend import BACKENDS

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                        help="backends to measure")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per backend")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=100, help="mini-batch size")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="optimizer")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and batches")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def measure(backend_name: str, steps: int, warmup: int, batch: int, optimizer: str,
            seed: int) -> dict[str, Any]:
    """Runs in a child process: create the backend, time gradients+apply steps."""
    from agent.model.backend import make_backend

    rng = np.random.default_rng(seed)
    xs = rng.random((8, batch, 784), dtype=np.float32)
    ys = rng.integers(0, 10, size=(8, batch))
    rss_before = _current_rss_mb()
    t0 = time.perf_counter()
    backend = make_backend(backend_name, rng, optimizer)
    create_ms = (time.perf_counter() - t0) * 1000
    grad_ms, apply_ms = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        _, grad = backend.gradients(xs[i % 8], ys[i % 8])
        t1 = time.perf_counter()
        backend.apply(grad)
        t2 = time.perf_counter()
        if i >= warmup:
            grad_ms.append((t1 - t0) * 1000)
            apply_ms.append((t2 - t1) * 1000)
    step_ms = [g + a for g, a in zip(grad_ms, apply_ms, strict=True)]
    return {
        "backend": backend_name,
        "steps": steps,
        "batch": batch,
        "optimizer": optimizer,
        "step_ms_median": round(statistics.median(step_ms), 3),
        "step_ms_p90": round(_percentile(step_ms, 90), 3),
        "gradients_ms_median": round(statistics.median(grad_ms), 3),
        "apply_ms_median": round(statistics.median(apply_ms), 3),
        "create_ms": round(create_ms, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "rss_before_backend_mb": round(rss_before, 1),
        "rss_increase_mb": round(_peak_rss_mb() - rss_before, 1),
    }


def _child(queue: Any, kwargs: dict[str, Any]) -> None:
    try:
        queue.put(measure(**kwargs))
    except Exception as exc:  # report, do not hang the parent
        queue.put({"backend": kwargs["backend_name"], "error": f"{type(exc).__name__}: {exc}"})


def measure_in_child(kwargs: dict[str, Any]) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, args=(queue, kwargs))
    process.start()
    result: dict[str, Any] = queue.get()
    process.join()
    return result


def run(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.batch < 1 or args.warmup < 0:
        print("bench model: --steps and --batch must be positive, --warmup >= 0", file=sys.stderr)
        return 2
    results = []
    for name in args.backends:
        print(f"bench model: measuring {name} ({args.steps} steps, batch {args.batch})...",
              file=sys.stderr)
        results.append(measure_in_child({
            "backend_name": name, "steps": args.steps, "warmup": args.warmup,
            "batch": args.batch, "optimizer": args.optimizer, "seed": args.seed,
        }))
    document = {"benchmark": "model", "cpu_count": multiprocessing.cpu_count(), "results": results}
    if args.json:
        print(json.dumps(document))
    else:
        _print_table(results)
    return 1 if any("error" in r for r in results) else 0


def _print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'backend':8} {'step ms (median)':>17} {'p90':>8} {'grad ms':>8} {'apply ms':>9} "
          f"{'create ms':>10} {'peak MB':>8} {'+MB':>7}")
    for r in results:
        if "error" in r:
            print(f"{r['backend']:8} error: {r['error']}")
            continue
        print(f"{r['backend']:8} {r['step_ms_median']:17.2f} {r['step_ms_p90']:8.2f} "
              f"{r['gradients_ms_median']:8.2f} {r['apply_ms_median']:9.2f} {r['create_ms']:10.1f} "
              f"{r['peak_rss_mb']:8.1f} {r['rss_increase_mb']:7.1f}")
