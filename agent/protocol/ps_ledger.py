"""What an asynchronous parameter server owes each worker across rounds (``ps-async``).

The server applies each worker's gradient as it arrives and answers with the updates applied
so far this round plus what it owed that worker from earlier rounds; what it applies after its
answer (later arrivals) is owed to the worker until its next answer. Every worker thereby
applies every update the server applied, in its own order and late: the staleness of an
asynchronous parameter server. The core keeps one ledger for the agent's life; only the
server's is ever written.
"""

from __future__ import annotations

import numpy as np


class ServerLedger:
    def __init__(self) -> None:
        self.owed: dict[int, np.ndarray] = {}  # worker -> float64 update it has not applied

    def take(self, worker: int, lo: int, hi: int, length: int) -> np.ndarray:
        """What ``worker`` is owed in [lo, hi), now paid (zeroed)."""
        owed = self._row(worker, length)
        part = owed[lo:hi].copy()
        owed[lo:hi] = 0.0
        return part

    def owe(self, worker: int, lo: int, values: np.ndarray, length: int) -> None:
        """Add ``values`` (from index ``lo``) to what ``worker`` is owed."""
        owed = self._row(worker, length)
        owed[lo:lo + len(values)] += values

    def forget(self, keep: set[int]) -> None:
        """Workers no longer in the fleet are owed nothing (a rejoiner installs the fleet's state)."""
        for worker in set(self.owed) - keep:
            del self.owed[worker]

    def settle(self, worker: int) -> None:
        """``worker`` is handed our whole state (it joins or resyncs): every update before it is
        in that state. A member restarted before its Will removed it stays in the view, and
        the old life's debt paid on top of the state made it another model than ours."""
        self.owed.pop(worker, None)

    def _row(self, worker: int, length: int) -> np.ndarray:
        row = self.owed.get(worker)
        if row is None or len(row) != length:
            row = self.owed[worker] = np.zeros(length, dtype=np.float64)
        return row
