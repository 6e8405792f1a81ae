"""`edgegrove bench`: the table of benchmarks (each row: a module with add_arguments/run)."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "model": Command("simulate.bench.model", "ms per training step and peak memory of both model backends"),
    "tflite": Command("simulate.bench.tflite", "peak memory, s per batch and file size of the agent's loss_and_grad on .tflite files or path/to/model.py:factory models (e.g. torch), on x86 and (--aarch64) under qemu"),
    "agent": Command("simulate.bench.agent", "peak resident memory and round time of agents in a small real fleet"),
    "broker": Command("simulate.bench.broker", "raw broker throughput (MB/s) with plain paho clients: the physical bound"),
    "isolation": Command("simulate.bench.isolation", "failed links until a node is isolated, vs tree height (thesis Figure 11)"),
    "gloo": Command("simulate.bench.gloo", "torch.distributed gloo allreduce of the same vector among local processes"),
    "allreduce": Command("simulate.bench.allreduce", "allreduce step time on real mosquitto: no/1/2 faults, fixed and adaptive timeouts, vs the thesis and the broker bound"),
    "accuracy": Command("simulate.bench.accuracy", "MNIST accuracy and time to accuracy of tree, ft-tree, rps, ps-sync, ps-async, ring fleets vs one machine"),
    "loss": Command("simulate.bench.loss", "accuracy after a fixed number of rounds under chunk loss p (the RPS claim)"),
    "silent": Command("simulate.bench.silent", "what a frozen (SIGSTOP) or crashed root/inner/leaf costs a real fleet, and how fast it is back"),
    "compare": Command("simulate.bench.compare", "gloo and edgegrove interleaved in one run: medians, ratio, broker bound, agents' CPU per round"),
    "round-profile": Command("simulate.bench.round_profile", "where a fault-free round's time goes: per-agent compute/allreduce, CPU of agents and mosquitto, vs the bound"),
    "links": Command("simulate.bench.links", "every agent's link limited (2-50 MB/s) x wire format: allreduce vs the busiest link's bound, degraded rounds, bytes, accuracy"),
    "flower": Command("simulate.bench.flower", "Flower 1.42 (deployment engine, FedAvg) vs an Edgegrove fleet: round time, time/bytes to accuracy, memory per client, faults"),
    "sites": Command("simulate.bench.sites", "a fleet over sites: bytes across the uplinks per round vs the minimum, site-aware vs site-blind tree (--real: real bridged brokers, shaped uplinks, --faults)"),
    "tta": Command("simulate.bench.tta_runs", "wall time, bytes and samples to a target accuracy per link rate x sync period (--sync-every 1 8 auto), table and plot"),
    "jobs": Command("simulate.bench.jobs", "five devices installed once run three jobs in a row (MLP, CNN .tflite dirichlet:0.5, digits with one device rejecting): states, fetched model's accuracy vs the fleet's, memory, no restart"),
    "signatures": Command("simulate.bench.signatures", "fault-free round time and bytes per round with the control messages signed (device keys) vs unsigned, alternately in one sitting"),
    "report": Command("simulate.evaluation", "regenerate docs/EVALUATION.md and its plots from docs/results/*.json"),
}
