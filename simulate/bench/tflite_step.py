"""The process `edgegrove bench tflite` measures: load one model, a `.tflite` into
``TfliteModel`` (as an agent does: one interpreter, one thread) or a Python-path spec
(``path/to/model.py:factory``, e.g. a ``TorchModel``) through ``agent.model.loader.load_model``
as an agent loads it, and time ``loss_and_grad`` on random batches, then print one JSON line
with the figures. Imports numpy and the agent's model alone, so its peak resident memory is the
model's runtime's (LiteRT, torch), the model's and Python's; it runs from an aarch64 site too
(``scripts/arm64-env.sh python SITE -m simulate.bench.tflite_step MODEL``).

    python -m simulate.bench.tflite_step MODEL [--batch 16] [--steps 10] [--warmup 2] [--seed 0]
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


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def litert_version() -> str | None:
    return version("ai-edge-litert")


def is_tflite(spec: str) -> bool:
    """A `.tflite` file, else a spec for ``load_model`` (``path/to/model.py:factory``)."""
    return spec.endswith(".tflite")


def load(spec: str) -> Any:
    """The model as an agent has it: a `.tflite` straight into ``TfliteModel``, anything else
    through ``load_model`` (its factory called, the contract checked on a batch of 2)."""
    if is_tflite(spec):
        from agent.model.tflite_model import TfliteModel

        return TfliteModel(spec)
    from agent.model.loader import load_model

    return load_model(spec)


def runtime(spec: str) -> dict[str, str | None]:
    """The library the model runs on, by name and version, after it is loaded."""
    if is_tflite(spec):
        return {"runtime": "litert", "runtime_version": litert_version()}
    if "torch" in sys.modules:  # the factory imported it: the torch adapter or its own module
        return {"runtime": "torch", "runtime_version": str(sys.modules["torch"].__version__)}
    return {"runtime": "python", "runtime_version": None}


def measure(spec: str, batch: int, steps: int, warmup: int, seed: int) -> dict[str, Any]:
    """Load ``spec``, run ``warmup`` untimed then ``steps`` timed ``loss_and_grad`` calls."""
    rss_before = current_rss_mb()
    t0 = time.perf_counter()
    model = load(spec)
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
        "file": spec,
        # A Python-path model has no file of its own to ship: its size is its parameters'.
        "file_bytes": Path(spec).stat().st_size if is_tflite(spec) else None,
        "parameters": model.param_count,
        # Running statistics in the vector: batch norm exported with `--batch-norm train`.
        "batch_norm_train": any(t.running for t in model.tensors),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "litert": litert_version(),
        **runtime(spec),
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
                                     description="Time loss_and_grad of MODEL (a .tflite file or "
                                                 "path/to/model.py:factory); print one JSON line.")
    parser.add_argument("model", metavar="MODEL")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = measure(args.model, args.batch, args.steps, args.warmup, args.seed)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
