"""How many values a chunk holds in a round: a fleet decision, carried by the view.

A node forwards a chunk only once it has it whole, and so does the broker (MQTT stores and
forwards whole PUBLISH packets). On a link that is slow for its bytes (Wi-Fi, 100 Mbit/s) a
round therefore costs about the busiest link's bytes over its rate, plus one chunk's time on
a link for every link a chunk crosses in turn (up and down through the broker, each level of
the reduce and of the broadcast): at 7 agents seven such crossings, with 1 MB chunks 2.6-3.2x
the busiest link's bound at 2-6 MB/s (`edgegrove bench links`). Smaller chunks shorten that
fill. On fast links (loopback, gigabit Ethernet) the opposite holds: per message costs
dominate and 262,144 values beat every smaller size (docs/PROFILE.md).

Every member must cut the vector the same way in a round, so the size is not a local choice:
the coordinator puts it in the view (``View.chunk_values``; 0 = the agents' configured
``chunk_size``) and every member applies the view of the round. The coordinator decides from
its own downlink: how fast large messages arrived, first byte to last, as the transport
timed them (``Message.arrival``; an untimed one counts as fast). That is the link's rate, not the host's load: on loopback with a
load of 10 on 2 cores, 1 MB frames arrived at 0.56 GB/s and more (2nd percentile; median 5.5
GB/s), through a 6 MB/s proxy at 5.7-6.6 MB/s (25th-75th percentile). The round trip of an
ACK is no such measure: the peer's scheduling is in it (loopback's ACK-based rates had a
median of 39 MB/s on that host).

Pure: no clock, no IO; the core feeds samples and asks after each round.
"""

from __future__ import annotations

from agent.protocol.rto import RecentRates

# The sizes a chunk may have (agent option ``chunk_size``, ``View.chunk_values``).
MIN_CHUNK_VALUES, MAX_CHUNK_VALUES = 64, 1 << 20
# A message this large arriving counts as a sample of the downlink's rate. A link hands bytes
# on in pieces (a real one packet by packet, the simulator's proxy 64 KB at a time), and the
# clock starts with the first: a message within one or two pieces reads as instant or twice
# as fast. And a message that queued behind another (the coordinator's downlink carries its
# children's chunks back to back) is partly in the socket before we start its clock: at 7
# agents and 50 MB/s the coordinator read its 128 KB float32 chunks (32,768 values) at 100
# MB/s to 16 GB/s, so a fleet on small chunks went back to large ones every few rounds (0.20 s
# rounds against 0.13 s on small chunks); its 1 MB and 0.58 MB chunks read 45-60 MB/s. So only
# the chunks of the configured size (262,144 values: 256 KB even in int8) and state transfers
# are timed: a fleet on small chunks keeps them until such a message shows the link fast again.
DOWNLINK_SAMPLE_BYTES = 256 * 1024
DOWNLINK_SAMPLES = 8  # the rate: from this many latest samples
# Below this rate a 1 MB chunk spends more than 10 ms on each link it crosses: the fill of
# the pipeline counts, take smaller chunks. Loopback and gigabit links stay above it.
SLOW_DOWNLINK_RATE = 100e6  # bytes/s
# ... and back to the configured size only above this (no flapping between two views).
FAST_DOWNLINK_RATE = 300e6  # bytes/s
# Chunks on a slow link: the fill is a fixed share of the bytes, the same at every rate. At
# 7 agents, 6 MB/s, float32 (bound 0.81 s; host load 6-7 on 2 cores), the median allreduce was
# 2.3-2.5 s with 262,144 values, 1.30 s with 65,536 and 1.18 s with 32,768 (128 KB frames).
SLOW_LINK_CHUNK_VALUES = 32_768
SLOW_LINK_BROADCAST = "fanout"  # the View.broadcast of a fleet on slow links
# A view over several sites crosses the sites' uplinks, and the coordinator's downlink cannot
# time them: its site's broker stores each message whole and hands it on at local speed. So
# such a fleet goes by this rate for its uplinks (below SLOW_DOWNLINK_RATE: slow-link chunks
# and the fan-out). With 1 MB chunks each of the two uplinks a chunk crosses (and the core
# broker between them) held it whole: a 3 x 3 fleet at 10 MB/s, 40 ms took 0.74 s a round,
# 0.52 s with 32,768 values (bound 0.41 s).
ASSUMED_UPLINK_RATE = 10e6  # bytes/s


# A unit's ACK from another site comes back over both sites' uplinks, each one FIFO shared by
# the whole site, behind whatever else they carry: when a cut-off site rejoins, its agents'
# state transfers (weights and optimizer: 3 vectors each, in stripes from two peers of the
# root's site) beside the round's own vectors. A timeout shorter than that drain declared a live
# link dead (3 x 3, 10 MB/s: the ACKs to site s2's root waited behind 6.5 MB of state), its
# units went round by relay and flood, its site skipped the round, drifted and fetched the
# state again, over the same uplinks: a split for 10-40 rounds.
CROSS_SITE_QUEUED_VECTORS = 6


def cross_site_timeout(vector_bytes: int, max_timeout: float) -> float:
    """The least timeout of a link to another site: CROSS_SITE_QUEUED_VECTORS vectors drained
    at ASSUMED_UPLINK_RATE (1 s for the thesis MLP's), never above ``max_timeout``."""
    return min(max_timeout, CROSS_SITE_QUEUED_VECTORS * vector_bytes / ASSUMED_UPLINK_RATE)


def rate_across_sites(measured: float | None, sites: list[str]) -> float | None:
    """The rate the coordinator chooses chunks and broadcast by: its downlink's, or for a view
    over more than one site at most ASSUMED_UPLINK_RATE."""
    if len(set(sites)) < 2:
        return measured
    return ASSUMED_UPLINK_RATE if measured is None else min(measured, ASSUMED_UPLINK_RATE)


class DownlinkRate:
    """The rate large messages arrived at lately, bytes/s: the lower quartile of the latest
    samples. A sample can only err fast: a message that came while we were busy waited
    whole in the socket's buffer and is read at once (on a loaded host half the 6 MB/s
    samples read as fast, and a median flipped the fleet back to large chunks); a slow one
    is the link (the loaded loopback's 2nd percentile was 0.56 GB/s)."""

    def __init__(self, samples: int = DOWNLINK_SAMPLES) -> None:
        self._rates = RecentRates(samples)
        self._enough = max(1, samples // 2)

    def observe(self, nbytes: int, seconds: float) -> None:
        """A message of ``nbytes`` arrived ``seconds`` after its first byte (0: in one read,
        faster than we can time)."""
        if nbytes < DOWNLINK_SAMPLE_BYTES or not seconds >= 0:
            return  # too small to say anything about the link
        self._rates.add(nbytes / seconds if seconds > 0 else float("inf"))

    def rate(self) -> float | None:
        """None until enough samples to judge (half the window)."""
        return self._rates.lower_quartile() if len(self._rates) >= self._enough else None


def broadcast_for(rate: float | None, current: str) -> str:
    """The ``View.broadcast`` the coordinator wants from the downlink's ``rate``, given the
    ``current`` view's ("" = the configured one): the fan-out on a slow downlink, "" on a fast
    one, unchanged without evidence and between the two thresholds.

    Relayed down the tree, the result crosses an inner node's uplink once per child, after its
    reduce and in series with it: ~4 vectors' time on the busiest link for 3 vectors' bytes.
    Published once on the root's fan-out topic, every member's downlink carries it once, in the
    same 3 vectors (bench links, 7 agents, 6 and 12.5 MB/s, float16 and int8: 1.27-1.51x the
    busiest link's bound against 1.49-1.67x relayed). On loopback the relay's extra hop costs
    CPU, not link time, and the agents keep what they are configured with."""
    if rate is None:
        return current
    if rate < SLOW_DOWNLINK_RATE:
        return SLOW_LINK_BROADCAST
    if rate > FAST_DOWNLINK_RATE:
        return ""
    return current


def chunk_values_for(rate: float | None, current: int, configured: int) -> int:
    """The ``View.chunk_values`` the coordinator wants from the downlink's ``rate``, given the
    ``current`` view's (0 = ``configured``). Unchanged without evidence and between the two
    thresholds."""
    if configured <= SLOW_LINK_CHUNK_VALUES or rate is None:
        return current  # nothing smaller to offer, or nothing known
    if rate < SLOW_DOWNLINK_RATE:
        return SLOW_LINK_CHUNK_VALUES
    if rate > FAST_DOWNLINK_RATE:
        return 0
    return current
