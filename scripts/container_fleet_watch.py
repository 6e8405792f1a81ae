#!/usr/bin/env python3
"""Watch a compose fleet through the dashboard's REST API, crash one agent and see it rejoin.

Called by scripts/container-fleet-test.sh once the fleet is up; standard library only.

1. every agent online, in the view and training; all of them at one round >= --rounds with
   one model hash (polled from /api/fleet: the snapshot must show every agent at the same
   round, so the hashes are comparable);
2. `<compose> kill agent-<k>`: the dashboard must see it go (the broker's Last Will), the
   container must be stopped, and the others must go on without it (a later round, one hash);
3. `<compose> start agent-<k>`: it must come back (a new incarnation), in the view, at the same
   round and with the same hash as every other agent.
Prints progress on stderr and, last, `container-fleet-test: summary {json}` on stdout.
Exit 0 when all of that held, 1 otherwise (with what was seen last).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

Fleet = dict[str, Any]


class Failed(Exception):
    pass


def log(message: str) -> None:
    print(f"container-fleet-test: {message}", file=sys.stderr, flush=True)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def wait_for(what: str, timeout: float, check: Callable[[], Any], poll: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy; the dashboard may not answer yet."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            result = check()
            if result:
                return result
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            last_error = f" (last error: {exc})"
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what}{last_error}")
        time.sleep(poll)


def nodes_by_id(fleet: Fleet) -> dict[int, dict[str, Any]]:
    return {int(n["node"]): n for n in fleet["nodes"]}


def agreed(fleet: Fleet, members: set[int], min_round: int) -> tuple[int, str] | None:
    """(round, hash) when every member is online, in the view, at one round >= min_round, with
    one model hash; None otherwise."""
    view = fleet.get("view") or {}
    if set(view.get("members", [])) != members:
        return None
    nodes = nodes_by_id(fleet)
    if not members <= nodes.keys():
        return None
    chosen = [nodes[i] for i in sorted(members)]
    if any(n["state"] != "online" or not n["in_view"] or n["last_round"] is None for n in chosen):
        return None
    rounds = {n["last_round"] for n in chosen}
    hashes = {n["model_hash"] for n in chosen}
    if len(rounds) != 1 or len(hashes) != 1 or not next(iter(hashes)):
        return None
    round_ = rounds.pop()
    return (round_, hashes.pop()) if round_ >= min_round else None


def describe(fleet: Fleet) -> str:
    view = fleet.get("view") or {}
    rows = [f"view epoch {view.get('epoch')} members {view.get('members')}"]
    for n in fleet["nodes"]:
        rows.append(f"  agent {n['node']}: {n['state']}, in view {n['in_view']}, round "
                    f"{n['last_round']}, hash {n['model_hash']}, incarnation {n['incarnation']}")
    return "\n".join(rows)


def container_state(compose: list[str], service: str) -> str:
    out = subprocess.run([*compose, "ps", "--format", "{{.Names}} {{.State}}"],
                         capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        name, _, state = line.partition(" ")
        # podman-compose names it <project>_<service>_1, docker compose <project>-<service>-1
        if name.endswith((f"_{service}_1", f"-{service}-1")):
            return state.strip()
    return "absent"


def run_compose(compose: list[str], *args: str) -> None:
    log(f"$ {shlex.join([*compose, *args])}")
    done = subprocess.run([*compose, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Failed(f"compose {' '.join(args)} failed ({done.returncode}): "
                     f"{done.stderr.strip()[-800:]}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the dashboard, e.g. http://127.0.0.1:8080")
    parser.add_argument("--compose", required=True, help="the compose command, with -p PROJECT")
    parser.add_argument("--agents", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=30, help="rounds to reach before the kill")
    parser.add_argument("--kill", type=int, default=3, help="the agent to kill and start again")
    parser.add_argument("--service-prefix", default="agent-",
                        help="compose service of node N: PREFIX + N (device- for a fleet of devices)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds for each phase (generous: a loaded 2-core host)")
    parser.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE",
                        help="added to the summary")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    compose = shlex.split(args.compose)
    fleet_url = args.url.rstrip("/") + "/api/fleet"
    everyone = set(range(args.agents))
    victim = args.kill
    summary: dict[str, Any] = dict(item.split("=", 1) for item in args.extra)
    last: Fleet = {}

    def fleet() -> Fleet:
        nonlocal last
        last = get_json(fleet_url)
        return last

    t_start = time.monotonic()
    try:
        wait_for("the dashboard", args.timeout, lambda: get_json(args.url.rstrip("/") + "/healthz")
                 ["broker_connected"])
        log(f"dashboard up and connected to the broker after {time.monotonic() - t_start:.1f} s")

        def all_training() -> bool:
            f = fleet()
            nodes = nodes_by_id(f)
            return everyone <= nodes.keys() and all(
                nodes[i]["state"] == "online" and nodes[i]["last_round"] is not None
                for i in everyone)

        wait_for(f"all {args.agents} agents online and training", args.timeout, all_training)
        log(f"all {args.agents} agents online and training after "
            f"{time.monotonic() - t_start:.1f} s")

        round_, hash_ = wait_for(f"{args.agents} agents at one round >= {args.rounds} with one "
                                 "model hash", args.timeout,
                                 lambda: agreed(fleet(), everyone, args.rounds))
        log(f"round {round_}: all {args.agents} agents hold model hash {hash_} "
            f"({time.monotonic() - t_start:.1f} s after up)")
        log(describe(last))
        summary.update(rounds_reached=round_, hash_before_kill=hash_,
                       agents=args.agents,
                       distinct_hashes=len({n["model_hash"] for n in last["nodes"]}))
        incarnation = nodes_by_id(last)[victim]["incarnation"]
        rounds = get_json(args.url.rstrip("/") + "/api/rounds")
        summary["rounds_seen_by_dashboard"] = len(rounds)
        summary["degraded_rounds"] = sum(1 for r in rounds if r["degraded"])

        service = f"{args.service_prefix}{victim}"
        t_kill = time.monotonic()
        run_compose(compose, "kill", service)
        state = wait_for(f"container {service} to stop", 60,
                         lambda: (s := container_state(compose, service)) != "running" and s)
        log(f"container {service}: {state}")
        wait_for(f"the dashboard to see agent {victim} gone", args.timeout,
                 lambda: nodes_by_id(fleet())[victim]["state"] in ("offline", "suspected"))
        log(f"dashboard: agent {victim} {nodes_by_id(last)[victim]['state']} after "
            f"{time.monotonic() - t_kill:.1f} s")
        others = everyone - {victim}
        round_without, hash_without = wait_for(
            f"the {len(others)} others to go on without agent {victim}", args.timeout,
            lambda: agreed(fleet(), others, round_ + 1))
        log(f"round {round_without}: the {len(others)} others go on without agent {victim}, "
            f"one hash {hash_without} (view {last['view']['members']})")
        summary.update(round_without_victim=round_without, hash_without_victim=hash_without)

        t_start_again = time.monotonic()
        run_compose(compose, "start", service)

        def rejoined() -> tuple[int, str] | None:
            f = fleet()
            if nodes_by_id(f)[victim]["incarnation"] == incarnation:
                return None
            return agreed(f, everyone, round_without + 1)

        round_back, hash_back = wait_for(f"agent {victim} to rejoin with the fleet's hash",
                                         args.timeout, rejoined)
        back = nodes_by_id(last)[victim]
        log(f"rejoin: agent {victim} (incarnation {incarnation} -> {back['incarnation']}) is back "
            f"in the view after {time.monotonic() - t_start_again:.1f} s; round {round_back}: "
            f"all {args.agents} agents hold model hash {hash_back}")
        log(describe(last))
        summary.update(rejoin_round=round_back, hash_after_rejoin=hash_back,
                       rejoin_seconds=round(time.monotonic() - t_start_again, 1),
                       victim=victim, result="pass")
    except Failed as exc:
        log(f"FAILED: {exc}")
        if last:
            log("last fleet seen:\n" + describe(last))
        summary["result"] = f"fail: {exc}"
        print("container-fleet-test: summary " + json.dumps(summary), flush=True)
        return 1
    summary["seconds"] = round(time.monotonic() - t_start, 1)
    print("container-fleet-test: summary " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
