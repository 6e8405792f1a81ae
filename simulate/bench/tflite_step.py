"""The process `edgegrove bench tflite` measures: load one `.tflite` into ``TfliteModel`` (as
an agent does: one interpreter, one thread) and time ``loss_and_grad`` on random batches, then
print one JSON line with the figures. Imports numpy and the agent's model alone, so its peak
resident memory is the interpreter's, the model's and Python's; it runs from an aarch64 site
too (``scripts/arm64-env.sh python SITE -m simulate.bench.tflite_step FILE``).

    python -m simulate.bench.tflite_step FILE [--batch 16] [--steps 10] [--warmup 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

BATCHES = 4  # distinct random batches, cycled (the arithmetic does not depend on the values)


def peak_rss_mb() -> float:
    """ru_maxrss of this process (Linux: KiB). Under qemu-user it is the emulator's process."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def litert_version() -> str | None:
    try:
        return metadata.version("ai-edge-litert")
    except metadata.PackageNotFoundError:
        return None


def measure(path: Path, batch: int, steps: int, warmup: int, seed: int) -> dict[str, Any]:
    """Load ``path``, run ``warmup`` untimed then ``steps`` timed ``loss_and_grad`` calls."""
    from agent.model.tflite_model import TfliteModel

    rss_before = current_rss_mb()
    t0 = time.perf_counter()
    model = TfliteModel(path)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    xs = rng.random((BATCHES, batch, *model.input_shape), dtype=np.float32)
    ys = rng.integers(0, model.num_classes, size=(BATCHES, batch))
    params = model.initial_params(seed)
    seconds = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        model.loss_and_grad(params, xs[i % BATCHES], ys[i % BATCHES])
        if i >= warmup:
            seconds.append(time.perf_counter() - t0)
    return {
        "model": model.name,
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "parameters": model.param_count,
        # Running statistics in the vector: batch norm exported with `--batch-norm train`.
        "batch_norm_train": any(t.running for t in model.tensors),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "litert": litert_version(),
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
        "seconds_per_batch_median": round(statistics.median(seconds), 4),
        "seconds_per_batch_min": round(min(seconds), 4),
        "seconds_per_batch_max": round(max(seconds), 4),
        "load_seconds": round(load_s, 3),
        "rss_before_model_mb": round(rss_before, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulate.bench.tflite_step",
                                     description="Time TfliteModel.loss_and_grad on FILE; print one JSON line.")
    parser.add_argument("file", type=Path)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = measure(args.file, args.batch, args.steps, args.warmup, args.seed)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
