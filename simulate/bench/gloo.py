"""`edgegrove bench gloo`: what a fault-intolerant direct-TCP allreduce costs on this machine.

torch.distributed with the gloo backend averages the same 407,050-float32 vector (1.63 MB)
among N local processes (one CPU thread each, TCP over the loopback interface, a free port):
all_reduce(SUM) then division by N, timed per iteration after a barrier; an iteration lasts
as long as its slowest rank. Figures: median and spread in ms over --iterations.

Optional: torch is not a dependency of Edgegrove. Without it the bench says so and exits 0
({"available": false} with --json). `pip install torch` (a CPU wheel) makes it available.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import queue
import statistics
import time
from typing import Any

from agent.model.mlp import PARAM_COUNT
from agent.validate import arg, positive_seconds
from simulate.bench.common import (
    add_output_arguments,
    document,
    emit,
    format_table,
    progress,
    summary,
)

DESCRIPTION = __doc__
MODEL_VALUES = PARAM_COUNT  # the thesis model's parameters (= gradient values)
START_TIMEOUT_S = 300.0  # 31 processes importing torch on 2 cores take a while


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[7, 15, 31],
                        help="numbers of local processes (world sizes)")
    parser.add_argument("--iterations", type=int, default=50, help="timed allreduces per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed allreduces first")
    parser.add_argument("--values", type=int, default=MODEL_VALUES,
                        help="float32 values in the vector (the thesis model: 407,050)")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=START_TIMEOUT_S,
                        help="give up on a size after this many seconds")
    add_output_arguments(parser)


def torch_version() -> str | None:
    """The installed torch's version, or None when torch (or torch.distributed) is absent."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    return str(torch.__version__) if dist.is_available() else None


def rank_main(rank: int, world: int, port: int, values: int, iterations: int, warmup: int,
              results: Any) -> None:
    """One process of the group: time ``iterations`` averaging allreduces."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only, whatever the hostname resolves to
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=dt.timedelta(seconds=START_TIMEOUT_S))
        vector = torch.from_numpy(_vector(rank, values))
        times = []
        for i in range(warmup + iterations):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(vector, op=dist.ReduceOp.SUM)
            vector /= world
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        # An iteration is over when its slowest rank is done.
        gathered = [torch.zeros(iterations, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor(times, dtype=torch.float64))
        if rank == 0:
            slowest = torch.stack(gathered).max(dim=0).values.tolist()
            results.put({"ms": [1000 * t for t in slowest]})
        dist.destroy_process_group()
    except Exception as exc:  # tell the parent rather than leave it waiting
        results.put({"error": f"rank {rank}: {type(exc).__name__}: {exc}"})


def _vector(rank: int, values: int) -> Any:
    import numpy as np

    return np.random.default_rng(rank).standard_normal(values).astype(np.float32)


def measure(world: int, values: int, iterations: int, warmup: int, timeout: float,
            keep_samples: bool = False) -> dict[str, Any]:
    """``keep_samples``: also return every iteration's ms (``samples_ms``), for pooling."""
    from simulate.brokers import free_port

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, daemon=True,
                         args=(rank, world, port, values, iterations, warmup, results))
             for rank in range(world)]
    for proc in procs:
        proc.start()
    try:
        outcome = results.get(timeout=timeout)
    except queue.Empty:
        outcome = {"error": f"no result within {timeout:.0f} s"}
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():  # our own child, by its handle
                proc.terminate()
                proc.join(5)
    if "error" in outcome:
        return {"nodes": world, "error": outcome["error"]}
    ms = outcome["ms"]
    out = {"nodes": world, "values": values, "iterations": iterations,
           "ms": {k: round(v, 3) if isinstance(v, float) else v for k, v in summary(ms).items()},
           "ms_mean": round(statistics.fmean(ms), 3)}
    if keep_samples:
        out["samples_ms"] = ms
    return out


def run(args: argparse.Namespace) -> int:
    if any(n < 2 for n in args.nodes) or args.iterations < 1 or args.warmup < 0 or args.values < 1:
        progress("edgegrove bench gloo: --nodes must be >= 2, --iterations and --values >= 1, "
                 "--warmup >= 0")
        return 2
    version = torch_version()
    if version is None:
        progress("edgegrove bench gloo: torch is not installed, so there is nothing to compare "
                 "with; `pip install torch` (CPU wheel) to measure gloo. Skipped.")
        emit(document("gloo", available=False, reason="torch is not installed"), args,
             "gloo: not available (torch is not installed)")
        return 0
    results = []
    for world in args.nodes:
        progress(f"bench gloo: {world} processes, {args.iterations} allreduces of {args.values} "
                 "float32 values ...")
        results.append(measure(world, args.values, args.iterations, args.warmup, args.timeout))
    doc = document("gloo", available=True, torch=version, backend="gloo",
                   transport="TCP on 127.0.0.1", results=results)
    emit(doc, args, render_table(doc))
    return 1 if any("error" in r for r in results) else 0


def render_table(doc: dict[str, Any]) -> str:
    rows = [[r["nodes"], "error: " + r["error"], "", "", ""] if "error" in r else
            [r["nodes"], r["ms"]["median"], r["ms"]["p10"], r["ms"]["p90"], r["iterations"]]
            for r in doc["results"]]
    return (f"torch {doc['torch']} gloo allreduce (average) of {doc['results'][0].get('values', '?')} "
            "float32 values among local processes\n"
            + format_table(["nodes", "median ms", "p10 ms", "p90 ms", "iterations"], rows))
