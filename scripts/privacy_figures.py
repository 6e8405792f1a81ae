"""Issue 57's figures in one sitting: MNIST, 7 agents, the default faults, without differential
privacy and at epsilon 1, 3 and 8 (delta 1e-5), side by side with the accountant's epsilon; and
what masking a unit costs (agent/privacy/masking.py) against the clear path's round.

Run from the repository root: `python scripts/privacy_figures.py [--rounds N] [--out DIR]`
(each fleet run is `edgegrove simulate --scenario default`; its run directory is kept under DIR).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.privacy.masking import MaskingMember, add, decode, encode, unmask

RUNS: tuple[tuple[str, list[str]], ...] = (("no DP", []), ("epsilon 1", ["dp_epsilon=1"]), ("epsilon 3", ["dp_epsilon=3"]),
        ("epsilon 8", ["dp_epsilon=8"]))
CLIP = 1.0


def simulate(name: str, options: list[str], rounds: int, out: Path) -> dict[str, object]:
    if options:
        options = [f"dp_clip={CLIP}", *options]
    command = [sys.executable, "-m", "edgegrove.cli", "simulate", "--scenario", "default", "--rounds", str(rounds),
               "--no-dashboard", "--baseline", "none", "--json", "--out", str(out / name.replace(" ", "-"))]
    for option in options:
        command += ["--agent-option", option]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name}: simulate exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    summary: dict[str, object] = json.loads(done.stdout)
    return summary


@dataclass(frozen=True)
class DeviceKeys:
    """agent/protocol/keys.py's MemberKeys interface over fresh Ed25519 keys."""

    own_node: int
    sign: Callable[[bytes], bytes]
    public: Mapping[int, Ed25519PublicKey]

    def verify(self, node: int, data: bytes, signature: bytes) -> bool:
        try:
            self.public[node].verify(signature, data)
        except InvalidSignature:
            return False
        return True


def masking_fleet(members: int) -> list[MaskingMember]:
    private = [Ed25519PrivateKey.generate() for _ in range(members)]
    ring = {i: key.public_key() for i, key in enumerate(private)}
    fleet = [MaskingMember.fresh("figures", DeviceKeys(i, private[i].sign, ring)) for i in range(members)]
    for member in fleet:
        for other in fleet:
            if other is not member:
                assert member.agree(other.announcement())
    return fleet


def masking_cost(values: int = 407_050, members: int = 7) -> dict[str, float]:
    fleet_members = masking_fleet(members)
    unit = np.random.default_rng(0).normal(0, 0.01, values).astype(np.float32)
    started = time.perf_counter()
    masked = [m.mask(unit, round=1) for m in fleet_members]
    mask_s = (time.perf_counter() - started) / members
    started = time.perf_counter()
    encode(unit)
    encode_s = time.perf_counter() - started
    survivors, missing = list(range(members - 2)), [members - 2, members - 1]
    total = add(masked[s] for s in survivors)
    shares = {(sh.survivor, sh.missing): sh for s in survivors
              for sh in fleet_members[s].recovery_shares(missing, 1)}
    started = time.perf_counter()
    result = decode(unmask(total, survivors, missing, 1, shares))
    unmask_s = time.perf_counter() - started
    error = float(np.max(np.abs(result - unit * len(survivors))))
    return {"mask_s": mask_s, "encode_s": encode_s, "unmask_two_missing_s": unmask_s, "sum_error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="privacy-figures-"))
    print(f"MNIST, 7 agents, scenario default, {args.rounds} rounds, clip {CLIP} per example, delta 1e-5 "
          f"(run directories under {out})")
    print(f"{'run':<10} {'accuracy':>8} {'epsilon':>8} {'round s (fault-free median)':>28} {'bytes/round':>12} "
          f"{'compute s':>10}")
    for name, options in RUNS:
        s = simulate(name, options, args.rounds, out)
        eps = s.get("dp_epsilon")
        print(f"{name:<10} {s['final_test_accuracy']:>8.4f} {('-' if eps is None else f'{eps:.3f}'):>8} "
              f"{s['round_time_fault_free_median_s']:>28.3f} {s['bytes_per_round_median']:>12} "
              f"{s.get('compute_s_median') or 0:>10.4f}", flush=True)
    cost = masking_cost()
    print(f"masking a 407,050-value unit (7 members: 6 pair masks): {cost['mask_s'] * 1000:.1f} ms per member "
          f"(fixed-point encoding alone {cost['encode_s'] * 1000:.1f} ms); the aggregator cancelling 2 missing "
          f"members' masks (5 survivors): {cost['unmask_two_missing_s'] * 1000:.1f} ms; "
          f"max error of the unmasked sum {cost['sum_error']:.2e}")
    print("bytes: a masked value is a uint32, 4 bytes as float32 (no float16/int8 wire formats); key announcement "
          "32 B key + 64 B signature per member per job; a recovery share 32 B per survivor per missing member")


if __name__ == "__main__":
    main()
