"""`edgegrove bench broker`: the physical bound, raw broker throughput on this machine.

Plain paho clients in separate processes (QoS 0, TCP_NODELAY, as the agents): one publisher
sends back-to-back messages of one payload size on one topic to 1 subscriber (one-to-one) or
to k subscribers (fan-out), on a real mosquitto rendered from broker-config/ and on the
embedded rumqttd broker. One repeat = the publisher sends about --megabytes of payload; it
lasts from the publisher's first publish to the last message's arrival at the slowest
subscriber (all processes read the same monotonic clock). Figures are medians over repeats:

  delivered MB/s   payload bytes that arrived at the subscribers (summed) per second
  broker MB/s      bytes through the broker per second, ingress + egress (MQTT packets);
                   the throughput that `bound_seconds` divides by

MB = 10^6 bytes. Default sizes: one allreduce chunk (16,384 float32 values = 64 KiB plus the
frame header) and the whole 407,050-value gradient (1.63 MB) as one frame. For a tree of N
agents, `allreduce_traffic(N)` counts the bytes one allreduce pushes through the broker
(each tree edge carries the gradient up once and down once, plus the ACKs) and
`bound_seconds(bytes, throughput)` the shortest time the broker needs to move them.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import queue
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.model.mlp import PARAM_COUNT
from agent.protocol import wire
from agent.protocol.topology import Tree
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
# The chunk size the committed broker and allreduce figures were measured with; the agents now
# default to DEFAULT_CHUNK_VALUES (262,144: bench links uses that).
CHUNK_VALUES = 16_384
BITMAP_BYTES_7 = 1  # contributor bitmap of a fleet of up to 8 nodes
CHUNK_FRAME_BYTES = wire.HEADER_SIZE + BITMAP_BYTES_7 + 4 * CHUNK_VALUES + 4
GRADIENT_FRAME_BYTES = wire.HEADER_SIZE + BITMAP_BYTES_7 + 4 * MODEL_VALUES + 4
DEFAULT_SIZES = [CHUNK_FRAME_BYTES, GRADIENT_FRAME_BYTES]
BENCH_JOB = "bench-broker"
MIN_PAYLOAD = 16  # kind byte + repeat number + some payload
ITEM_BYTES = {wire.DType.F32: 4, wire.DType.F16: 2, wire.DType.I8: 1, wire.DType.U32: 4}
TREE_SIZES = (7, 15, 31, 63)
READY_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------------------
# Bytes through the broker per allreduce, and the bound
# --------------------------------------------------------------------------------------

def mqtt_publish_bytes(topic: str, payload_bytes: int) -> int:
    """Size on the wire of one QoS 0 MQTT 3.1.1 PUBLISH: fixed header, remaining length
    (1-4 bytes, 7 bits each), topic length + topic, payload (no packet id at QoS 0)."""
    remaining = 2 + len(topic.encode()) + payload_bytes
    length_bytes = 1 if remaining < 128 else 2 if remaining < 16_384 else 3 if remaining < 2_097_152 else 4
    return 1 + length_bytes + remaining


def frame_bytes(n_values: int, contributors: frozenset[int], dtype: wire.DType = wire.DType.F32) -> int:
    """Size of an encoded wire frame (header + contributor bitmap + payload + CRC32)."""
    bitmap = 0 if not contributors else max(contributors) // 8 + 1
    return wire.HEADER_SIZE + bitmap + ITEM_BYTES[dtype] * n_values + 4


@dataclass(frozen=True)
class AllreduceTraffic:
    """What one fault-free allreduce pushes through the broker."""

    nodes: int
    chunks: int
    messages: int  # PUBLISH packets the broker receives (data + ACKs)
    ingress_bytes: int  # agents -> broker
    egress_bytes: int  # broker -> subscribers

    @property
    def total_bytes(self) -> int:
        """What mosquitto counts: ingress + egress."""
        return self.ingress_bytes + self.egress_bytes

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class Publish:
    """One PUBLISH of a fault-free allreduce: who sends it, who receives it, its size."""

    sender: int
    receiver: int
    topic: str
    frame_bytes: int  # the wire frame (what the agents count as bytes sent)

    @property
    def mqtt_bytes(self) -> int:
        """The PUBLISH packet (what the broker and an agent's TCP connection carry)."""
        return mqtt_publish_bytes(self.topic, self.frame_bytes)


def allreduce_publishes(
    nodes: int, *, n_values: int = MODEL_VALUES, chunk_values: int = CHUNK_VALUES,
    dtype: wire.DType = wire.DType.F32, arity: int = 2, acks: bool = True,
    prefix: str = "edgegrove/job",
) -> Iterator[Publish]:
    """Every PUBLISH of one fault-free allreduce on a tree of ``nodes`` (ids 0..n-1).

    Each tree edge carries the gradient twice, chunk by chunk: the child's subtree mean up
    (reduce) and the root's mean down (broadcast); every chunk is ACKed by its receiver.
    """
    if nodes < 1 or n_values < 1 or chunk_values < 1:
        raise ValueError("nodes, n_values and chunk_values must be >= 1")
    tree = Tree.of(range(nodes), arity)
    chunks = math.ceil(n_values / chunk_values)
    sizes = [min(chunk_values, n_values - i * chunk_values) for i in range(chunks)]
    everyone = frozenset(range(nodes))
    for child in tree.members:
        parent = tree.parent(child)
        if parent is None:
            continue
        for contributors, sender, receiver in ((tree.subtree(child), child, parent),
                                               (everyone, parent, child)):
            data_topic, ack_topic = f"{prefix}/link/{sender}/{receiver}", f"{prefix}/link/{receiver}/{sender}"
            for n in sizes:
                yield Publish(sender, receiver, data_topic, frame_bytes(n, contributors, dtype))
                if acks:
                    yield Publish(receiver, sender, ack_topic, frame_bytes(0, contributors))


def allreduce_traffic(
    nodes: int, *, n_values: int = MODEL_VALUES, chunk_values: int = CHUNK_VALUES,
    dtype: wire.DType = wire.DType.F32, arity: int = 2, acks: bool = True,
    subscribers_per_link: int = 1, prefix: str = "edgegrove/job",
) -> AllreduceTraffic:
    """Bytes through the broker for one allreduce on a tree of ``nodes`` (ids 0..n-1): every
    PUBLISH of ``allreduce_publishes`` enters the broker once and leaves it once per
    subscriber of its link topic.
    """
    if subscribers_per_link < 1:
        raise ValueError("subscribers_per_link must be >= 1")
    packets = [p.mqtt_bytes for p in allreduce_publishes(
        nodes, n_values=n_values, chunk_values=chunk_values, dtype=dtype, arity=arity, acks=acks,
        prefix=prefix)]
    ingress = sum(packets)
    return AllreduceTraffic(nodes, math.ceil(n_values / chunk_values), len(packets), ingress,
                            ingress * subscribers_per_link)


def bound_seconds(bytes_through_broker: float, throughput: float) -> float:
    """The shortest time a broker moving ``throughput`` bytes/s (ingress + egress) needs for
    ``bytes_through_broker`` bytes (ingress + egress)."""
    if throughput <= 0:
        raise ValueError(f"throughput must be positive, got {throughput}")
    return float(bytes_through_broker) / float(throughput)


def throughput_from(doc: dict[str, Any], payload_bytes: int = CHUNK_FRAME_BYTES, *,
                    subscribers: int = 1, broker: str = "mosquitto") -> float:
    """Median broker throughput (bytes/s, ingress + egress) from a `bench broker` JSON
    document, for the measured payload size closest to ``payload_bytes``."""
    rows = [r for r in doc.get("results", []) if r.get("broker") == broker
            and r.get("subscribers") == subscribers and "broker_mb_s" in r]
    if not rows:
        raise ValueError(f"no {broker} measurement with {subscribers} subscriber(s) in the "
                         "document: run `edgegrove bench broker` with those settings")
    row = min(rows, key=lambda r: abs(math.log(r["payload_bytes"] / payload_bytes)))
    return float(row["broker_mb_s"]["median"]) * 1e6


def bound_table(throughput: float, sizes: tuple[int, ...] = TREE_SIZES, **kwargs: Any) -> list[dict[str, Any]]:
    """Per tree size: bytes through the broker per allreduce and the bound in ms."""
    rows = []
    for nodes in sizes:
        traffic = allreduce_traffic(nodes, **kwargs)
        rows.append({**traffic.as_dict(),
                     "bound_ms": round(1000 * bound_seconds(traffic.total_bytes, throughput), 3)})
    return rows


# --------------------------------------------------------------------------------------
# The measuring processes (spawned: each its own interpreter and paho network thread)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    username: str | None
    password: str | None
    topic: str


def _connect(endpoint: Endpoint, client_id: str, on_message: Any = None) -> Any:
    import threading

    import paho.mqtt.client as paho

    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=paho.MQTTv311)
    if endpoint.username is not None:
        client.username_pw_set(endpoint.username, endpoint.password)
    connected, subscribed = threading.Event(), threading.Event()
    failure: list[str] = []

    def on_socket_open(c: Any, u: Any, sock: Any) -> None:
        # paho leaves Nagle on; the agents switch it off, so the bench does too.
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def on_connect(c: Any, u: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            failure.append(str(reason))
        connected.set()

    client.on_socket_open = on_socket_open
    client.on_connect = on_connect
    client.on_subscribe = lambda *a: subscribed.set()
    if on_message is not None:
        client.on_message = on_message
    client.connect(endpoint.host, endpoint.port, keepalive=120)
    client.loop_start()
    if not connected.wait(READY_TIMEOUT_S) or failure:
        client.loop_stop()
        raise RuntimeError(f"{client_id}: cannot connect to {endpoint.host}:{endpoint.port}: "
                           f"{failure[0] if failure else 'no CONNACK'}")
    if on_message is not None:
        client.subscribe(endpoint.topic, qos=0)
        if not subscribed.wait(READY_TIMEOUT_S):
            raise RuntimeError(f"{client_id}: no SUBACK for {endpoint.topic}")
    return client


def _header(kind: bytes, repeat: int) -> bytes:
    return kind + repeat.to_bytes(4, "little")


def subscriber_main(endpoint: Endpoint, index: int, ready: Any, reports: Any, stop: Any) -> None:
    """Count the messages of each repeat; report (first, last arrival, count, bytes) when the
    publisher's end marker of that repeat arrives (QoS 0 keeps one publisher's order)."""
    state: dict[str, Any] = {"repeat": -1, "first": None, "last": None, "count": 0, "bytes": 0}

    def on_message(c: Any, u: Any, msg: Any) -> None:
        now = time.perf_counter()
        payload = msg.payload
        kind, repeat = payload[:1], int.from_bytes(payload[1:5], "little")
        if repeat != state["repeat"]:
            state.update(repeat=repeat, first=None, last=None, count=0, bytes=0)
        if kind == b"D":
            state["first"] = state["first"] or now
            state.update(last=now, count=state["count"] + 1, bytes=state["bytes"] + len(payload))
        elif kind == b"E":
            reports.put({"subscriber": index, "repeat": repeat, "first": state["first"],
                         "last": state["last"], "count": state["count"], "bytes": state["bytes"]})

    try:
        client = _connect(endpoint, f"bench-sub-{index}-{multiprocessing.current_process().pid}",
                          on_message)
    except Exception as exc:  # tell the parent, do not leave it waiting
        ready.put(f"error: {exc}")
        return
    ready.put("ready")
    stop.wait()
    client.disconnect()
    client.loop_stop()


def publisher_main(endpoint: Endpoint, size: int, count: int, ready: Any, go: Any,
                   started: Any) -> None:
    """For each repeat number from ``go``: publish ``count`` messages of ``size`` bytes
    back to back, then the end marker; report the time of the first publish."""
    try:
        client = _connect(endpoint, f"bench-pub-{multiprocessing.current_process().pid}")
    except Exception as exc:
        ready.put(f"error: {exc}")
        return
    ready.put("ready")
    while (repeat := go.get()) is not None:
        payload = _header(b"D", repeat) + bytes(size - 5)
        t0 = time.perf_counter()
        for _ in range(count):
            info = client.publish(endpoint.topic, payload, qos=0)
        info.wait_for_publish(READY_TIMEOUT_S)
        client.publish(endpoint.topic, _header(b"E", repeat), qos=0)
        started.put({"repeat": repeat, "t0": t0})
    client.disconnect()
    client.loop_stop()


# --------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    broker: str
    payload_bytes: int
    subscribers: int
    messages: int  # per repeat
    repeats: int
    warmup: int


def messages_per_repeat(payload_bytes: int, megabytes: float) -> int:
    return max(4, math.ceil(megabytes * 1e6 / payload_bytes))


def repeat_figures(case: Case, topic: str, t0: float, reports: list[dict[str, Any]]) -> dict[str, float | int]:
    """Throughputs of one repeat from the publisher's start and the subscribers' reports."""
    arrivals = [r["last"] for r in reports if r["last"] is not None]
    received = sum(r["count"] for r in reports)
    lost = case.messages * case.subscribers - received
    if not arrivals:
        return {"lost": lost}
    elapsed = max(arrivals) - t0
    wire_bytes = mqtt_publish_bytes(topic, case.payload_bytes)
    broker_bytes = case.messages * wire_bytes + received * wire_bytes
    return {
        "seconds": elapsed,
        "delivered_mb_s": sum(r["bytes"] for r in reports) / elapsed / 1e6,
        "broker_mb_s": broker_bytes / elapsed / 1e6,
        "messages_per_s": received / elapsed,
        "lost": lost,
    }


def _get(q: Any, timeout: float, what: str) -> Any:
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}") from None


def measure_case(case: Case, endpoint: Endpoint, repeat_timeout: float) -> dict[str, Any]:
    """Run one case (broker, size, subscribers) in fresh processes; medians over repeats."""
    ctx = multiprocessing.get_context("spawn")
    ready, reports, started, go = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    stop = ctx.Event()
    procs = [ctx.Process(target=subscriber_main, args=(endpoint, i, ready, reports, stop), daemon=True)
             for i in range(case.subscribers)]
    procs.append(ctx.Process(target=publisher_main, daemon=True,
                             args=(endpoint, case.payload_bytes, case.messages, ready, go, started)))
    samples: list[dict[str, Any]] = []
    try:
        for proc in procs[:-1]:
            proc.start()
        _expect_ready(ready, case.subscribers)
        procs[-1].start()
        _expect_ready(ready, 1)
        for repeat in range(case.warmup + case.repeats):
            go.put(repeat)
            t0 = _get(started, repeat_timeout, "the publisher")["t0"]
            got = [_get(reports, repeat_timeout, "the subscribers' end markers")
                   for _ in range(case.subscribers)]
            if any(r["repeat"] != repeat for r in got):
                raise RuntimeError("a subscriber reported another repeat (an end marker was lost)")
            if repeat >= case.warmup:
                samples.append(repeat_figures(case, endpoint.topic, t0, got))
    finally:
        go.put(None)
        stop.set()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():  # our own child, by its handle
                proc.terminate()
                proc.join(5)
    return _case_result(case, samples)


def _expect_ready(ready: Any, count: int) -> None:
    for _ in range(count):
        message = _get(ready, READY_TIMEOUT_S, "a client to connect")
        if message != "ready":
            raise RuntimeError(message)


def _case_result(case: Case, samples: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {**asdict(case), "lost": sum(int(s["lost"]) for s in samples)}
    timed = [s for s in samples if "seconds" in s]
    if not timed:
        return {**result, "error": "no message arrived"}
    for key in ("delivered_mb_s", "broker_mb_s", "messages_per_s", "seconds"):
        result[key] = {k: round(v, 4) if isinstance(v, float) else v
                       for k, v in summary([float(s[key]) for s in timed]).items()}
    return result


@contextmanager
def running_broker(kind: str, workdir: Path) -> Iterator[Endpoint]:
    """A mosquitto from broker-config/ (admin credentials, which may use every topic of the
    job) or the embedded rumqttd broker (anonymous)."""
    from simulate.brokers import start_embedded, start_mosquitto

    if kind == "mosquitto":
        with start_mosquitto(workdir / "mosquitto", job=BENCH_JOB, nodes=2) as broker:
            creds = broker.admin_credentials
            yield Endpoint(broker.host, broker.port, creds.username, creds.password,
                           f"{broker.prefix}/link/0/1")
    else:
        with start_embedded() as embedded:
            host, port = embedded.url.split("://", 1)[1].rsplit(":", 1)
            yield Endpoint(host, int(port), None, None, f"edgegrove/{BENCH_JOB}/link/0/1")


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, metavar="BYTES",
                        help=f"payload sizes in bytes (default: one 16,384-float32 chunk frame = "
                             f"{CHUNK_FRAME_BYTES}, the whole gradient frame = {GRADIENT_FRAME_BYTES})")
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 6], metavar="K",
                        help="subscribers per case: 1 = one-to-one, more = fan-out")
    parser.add_argument("--brokers", nargs="+", choices=("mosquitto", "embedded"),
                        default=["mosquitto", "embedded"], help="brokers to measure")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case (median over them)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed repeats first")
    parser.add_argument("--megabytes", type=float, default=32.0,
                        help="payload the publisher sends per repeat on mosquitto (MB = 10^6 bytes)")
    parser.add_argument("--embedded-megabytes", type=float, default=8.0,
                        help="the same for the (much slower) embedded broker")
    parser.add_argument("--repeat-timeout", type=arg(positive_seconds), default=120.0,
                        help="give up on a case when one repeat takes longer (seconds)")
    add_output_arguments(parser)


def _problem(args: argparse.Namespace) -> str | None:
    if any(s < MIN_PAYLOAD for s in args.sizes):
        return f"--sizes must be at least {MIN_PAYLOAD} bytes"
    if any(s > 8_000_000 for s in args.sizes):
        return "--sizes above 8,000,000 bytes exceed the broker's max_packet_size"
    if any(k < 1 for k in args.subscribers):
        return "--subscribers must be >= 1"
    if args.repeats < 1 or args.warmup < 0:
        return "--repeats must be >= 1 and --warmup >= 0"
    if args.megabytes <= 0 or args.embedded_megabytes <= 0 or args.repeat_timeout <= 0:
        return "--megabytes, --embedded-megabytes and --repeat-timeout must be positive"
    return None


def cases_for(args: argparse.Namespace, broker: str) -> list[Case]:
    megabytes = args.megabytes if broker == "mosquitto" else args.embedded_megabytes
    return [Case(broker, size, k, messages_per_repeat(size, megabytes), args.repeats, args.warmup)
            for size in args.sizes for k in args.subscribers]


def run(args: argparse.Namespace) -> int:
    problem = _problem(args)
    if problem is not None:
        progress(f"edgegrove bench broker: {problem}")
        return 2
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-broker-") as tmp:
        for broker in args.brokers:
            results += _measure_broker(broker, cases_for(args, broker), Path(tmp), args.repeat_timeout)
    doc = _document(args, results)
    emit(doc, args, render_table(doc))
    return 1 if any("error" in r for r in results) else 0


def _measure_broker(broker: str, cases: list[Case], workdir: Path, timeout: float) -> list[dict[str, Any]]:
    from simulate.brokers import BrokerError

    results: list[dict[str, Any]] = []
    try:
        with running_broker(broker, workdir) as endpoint:
            for case in cases:
                progress(f"bench broker: {broker}, {case.payload_bytes} B x {case.messages}, "
                         f"{case.subscribers} subscriber(s), {case.repeats} repeats ...")
                try:
                    results.append(measure_case(case, endpoint, timeout))
                except RuntimeError as exc:
                    results.append({**asdict(case), "error": str(exc)})
    except BrokerError as exc:
        results += [{**asdict(c), "error": str(exc)} for c in cases]
    return results


def _document(args: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    doc = document("broker", unit="MB = 10^6 bytes; broker_mb_s counts ingress + egress",
                   chunk_frame_bytes=CHUNK_FRAME_BYTES, gradient_frame_bytes=GRADIENT_FRAME_BYTES,
                   results=results)
    with contextlib.suppress(ValueError):
        throughput = throughput_from(doc, CHUNK_FRAME_BYTES)
        doc["bound"] = {"throughput_mb_s": round(throughput / 1e6, 1),
                        "basis": "mosquitto, one-to-one, payload closest to one chunk frame",
                        "trees": bound_table(throughput)}
    return doc


def render_table(doc: dict[str, Any]) -> str:
    rows = []
    for r in doc["results"]:
        if "error" in r:
            rows.append([r["broker"], r["payload_bytes"], r["subscribers"], "error: " + r["error"],
                         "", "", "", ""])
            continue
        rows.append([r["broker"], r["payload_bytes"], r["subscribers"], r["messages"],
                     r["delivered_mb_s"]["median"], r["broker_mb_s"]["median"],
                     f"{r['broker_mb_s']['p10']:.0f}-{r['broker_mb_s']['p90']:.0f}", r["lost"]])
    text = format_table(["broker", "payload B", "subs", "msgs/repeat", "delivered MB/s",
                         "broker MB/s (in+out)", "p10-p90", "lost"], rows)
    bound = doc.get("bound")
    if bound:
        text += (f"\n\nbound of one fault-free allreduce of {MODEL_VALUES} float32 values, chunks "
                 f"of {CHUNK_VALUES}, at {bound['throughput_mb_s']} MB/s ({bound['basis']}):\n")
        text += format_table(["nodes", "MQTT messages", "bytes through broker", "bound ms"],
                             [[t["nodes"], t["messages"], t["total_bytes"], t["bound_ms"]]
                              for t in bound["trees"]])
    return text
