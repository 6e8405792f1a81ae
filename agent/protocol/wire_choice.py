"""``wire_dtype = "auto"``: the wire format of a frame from its link's measured rate (issue 19).

A sender (ft-tree) picks float32, float16 or int8 for every unit of the reduce it sends to its
parent: the time this round's vector takes on that link in a format is its bytes in that
format over the link's typical rate (``LinkEstimators.typical_rate``: the median of its last
drains, each the bytes of a busy stretch of the link over the time to its last ACK); the
widest format whose time fits the budget (agent option ``wire_budget``, default
``AUTO_WIRE_BUDGET``) is taken, int8 when none does. A link never measured (the first round, a link that carried nothing yet) gets float32.

The thresholds this gives, for the thesis model (407,050 values: 1.63 MB in float32) and the
default budget of 0.1 s: float32 on a link that usually drains >= 16.3 MB/s, float16 from
8.1 MB/s, int8 below. Why these, and not a tighter budget:

- Loopback must stay float32 and must never fall to int8, however loaded the host. A
  CPU-starved agent on loopback still ACKs a 1 MB unit within tens of ms, i.e. >= 20 MB/s
  (above the float32 threshold). To reach int8 the median of its last 5 drains would have
  to be under 8.1 MB/s: most of its 1 MB units ACKed more than 120 ms after they left, round
  after round, which is a slow link, not a stall (a stall only ever lowers single samples,
  and the median ignores a minority of them).
- A link limited to 12.5 MB/s (100 Mbit/s) or less is shared by about two streams at its
  busiest (an inner node receives both children's means at once), so each peer measures about
  half of it: <= 6-7 MB/s, int8. There int8 is also the fastest fixed format by far (a quarter
  of the bytes; the must-show of issue 19 wants ``auto`` within 20 % of the best fixed
  format's time), and float16 and int8 keep the test accuracy within 0.3 pp of float32
  (``edgegrove bench links`` shows both).

A link's drains are the rate our units got through it, so they err slow on a loaded host: on
loopback they read 20-39 MB/s, on a 50 MB/s link (shared by about two streams) ~25 MB/s. There
the budget keeps float32, and the round took 0.13 s against int8's 0.061 s (7 agents, kernel
shaper, 2026-12-03): 2x slower, where issue 19 allows 20 %. So an agent also narrows by its
own link: its downlink's rate from large messages' arrival (``chunking.DownlinkRate``, which
can only err fast: on loopback >= 0.56 GB/s even at a load of 10 on 2 cores, at 50 MB/s 45-60
MB/s), as the coordinator judges the fleet's chunk size. The busiest link of the tree carries
about ``BUSIEST_LINK_VECTORS`` vectors each way; the widest format in which those take at most
``OWN_LINK_BUDGET`` at our link's rate is the widest we send: float32 from 163 MB/s (loopback,
any host load), float16 from 82 MB/s (gigabit Ethernet), int8 below (50 MB/s and slower).
Only narrower than the drains' choice, never wider: a slow peer's link still narrows what we
send to it, a fast own link does not widen it.

The result must be byte-identical on every member, so formats are never mixed within one
chunk's result: see ``FtTreeRound`` (a node sends a chunk's partial mean up in the narrowest of
its own link's choice and the formats its children's units for that chunk came in; the root
quantizes the result once in the narrowest format that went into it, and every member passes
those bytes on). Only the reduce chooses: a link's rate is learnt from ACKs of units of ours,
so a link that slows down still carries one or two rounds wide before its median says so.
"""

from __future__ import annotations

from agent.protocol.wire import DType, value_bytes

# Seconds this round's values may take on one link in the chosen format (see above).
AUTO_WIRE_BUDGET = 0.1
# The busiest link of a binary tree (an inner node's) carries about this many vectors each way.
BUSIEST_LINK_VECTORS = 3
# Seconds those may take at our own link's rate in the widest format we send (see above).
OWN_LINK_BUDGET = 0.03
# Widest first: the formats auto chooses from.
WIDEST_FIRST: tuple[DType, ...] = (DType.F32, DType.F16, DType.I8)


def narrowest(a: DType, b: DType) -> DType:
    """The narrower of two value formats."""
    return a if WIDEST_FIRST.index(a) >= WIDEST_FIRST.index(b) else b


def choose(n_values: int, rate: float | None, budget: float, widest: DType = DType.F32) -> DType:
    """The widest format, no wider than ``widest``, in which ``n_values`` values take at most
    ``budget`` seconds at ``rate`` bytes/s (None: never measured, ``widest``); int8 when even
    float16 does not fit."""
    if rate is None or rate <= 0:
        return widest
    for dtype in WIDEST_FIRST[WIDEST_FIRST.index(widest) :]:
        if n_values * value_bytes(dtype) / rate <= budget:
            return dtype
    return WIDEST_FIRST[-1]


def choose_for_own_link(n_values: int, rate: float | None, widest: DType = DType.F32) -> DType:
    """The widest format, no wider than ``widest``, in which the busiest link's vectors of
    ``n_values`` values take at most ``OWN_LINK_BUDGET`` at our own link's ``rate`` bytes/s
    (None: not measured yet, ``widest``)."""
    return choose(BUSIEST_LINK_VECTORS * n_values, rate, OWN_LINK_BUDGET, widest)
