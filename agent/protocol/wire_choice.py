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
