"""Answers proportional to asks (issue 54.4): what a node sends a peer in answer to its asks
(PULL: chunks of a round's result; MODEL_PULL: chunks of the training state) is bounded by the
bytes that peer sent it.

Amplification, by bytes: for one asker, the bytes of the frames sent to it in answer to its
asks divided by the bytes of the frames received from it (``frame_size``: header, bitmap,
payload, CRC; MQTT's own overhead left out, which only adds to the asker's side). The bound
``AMPLIFICATION`` holds at every moment, per round for the result (a round's machine keeps its
budget: every frame of that round from the asker counts, its data as much as its asks) and
cumulatively over the run for the state (a state pull waits for our round: its budget lives in
the core's state server). On top of it each stays "owed once per round" (ft_pull.py's copies
per chunk, state_server.py's one stripe).

An honest asker pays its way: it pads each ask with ``PAD_INDEX`` entries to a third of the
bytes it asks for (``padded``), so a ~60-byte ask is no longer answered with a 1 MB chunk
(18,000x), and a flood of them is answered with nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from agent.protocol.allreduce import frame_size
from agent.protocol.wire import HEADER_SIZE, DType, Frame

AMPLIFICATION = 3  # answer bytes per byte received from the asker, at most
PAD_INDEX = 0xFFFF_FFFF  # an index entry of a PULL or MODEL_PULL that only pads it
_CRC_BYTES = 4
_PAD = PAD_INDEX.to_bytes(4, "little")
_PAD_BYTES = len(_PAD)


class AnswerBudget:
    """Per asker: the bytes it sent us and the bytes we answered it with."""

    def __init__(self) -> None:
        self.received: Counter[int] = Counter()  # peer -> bytes of its frames that earn answers
        self.answered: Counter[int] = Counter()  # peer -> bytes of answers sent to it

    def earn(self, peer: int, nbytes: int) -> None:
        self.received[peer] += nbytes

    def owed(self, peer: int) -> int:
        """Bytes ``peer`` may still be answered with."""
        return AMPLIFICATION * self.received[peer] - self.answered[peer]

    def spend(self, peer: int, nbytes: int) -> bool:
        """An answer of ``nbytes`` to ``peer``, if its asks paid for it (then it is counted)."""
        if nbytes > self.owed(peer):
            return False
        self.answered[peer] += nbytes
        return True

    def amplification(self, peer: int) -> float:
        """Bytes answered per byte received from ``peer`` so far."""
        return self.answered[peer] / self.received[peer] if self.received[peer] else 0.0


def asked_indices(frame: Frame) -> list[int]:
    """The chunk indices a PULL or MODEL_PULL asks for, its padding left out (empty: all).
    Vectorized: a padded ask holds up to ~400,000 entries, a Python loop over them cost
    tens of milliseconds per ask on a loaded host."""
    entries = np.frombuffer(frame.payload, dtype="<u4")
    return [int(i) for i in entries[entries != PAD_INDEX]]


def padded(ask: Frame, answer_bytes: int) -> Frame:
    """``ask`` (a PULL or MODEL_PULL with its indices) padded so that its answer of
    ``answer_bytes`` is within ``AMPLIFICATION`` times its size."""
    lacking = -(-answer_bytes // AMPLIFICATION) - frame_size(ask)
    if lacking <= 0:
        return ask
    return replace(ask, dtype=DType.U32, payload=ask.payload + _PAD * -(-lacking // _PAD_BYTES))


def values_frame_bytes(n_values: int, item_bytes: int, top_id: int = -1) -> int:
    """Bytes of a frame carrying ``n_values`` values of ``item_bytes`` each, with a bitmap of
    contributors up to id ``top_id`` (-1: none)."""
    bitmap = top_id // 8 + 1 if top_id >= 0 else 0
    return HEADER_SIZE + bitmap + n_values * item_bytes + _CRC_BYTES
