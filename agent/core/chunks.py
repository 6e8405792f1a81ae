"""How the fleet cuts and hands down each round's vector: the chunk size and the broadcast a
round uses (from its view, else as configured), and the coordinator's choice of both from its
own downlink's rate (agent/protocol/chunking.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from agent.protocol.allreduce import Algorithm, AllreduceConfig, Broadcast, Note
from agent.protocol.chunking import DownlinkRate, broadcast_for, chunk_values_for, rate_across_sites
from agent.protocol.membership import Membership, PublishView
from agent.protocol.messages import View
from agent.protocol.notes import NoteKind


@dataclass
class ChunkPolicy:
    base: AllreduceConfig
    adapt_chunks: bool
    adapt_broadcast: bool

    def config_for(self, view: View) -> AllreduceConfig:
        """The allreduce configuration of a round of ``view``."""
        chunks = view.chunk_values or self.base.chunk_size
        broadcast = self.broadcast_in(view)
        if (chunks, broadcast) == (self.base.chunk_size, self.base.broadcast):
            return self.base
        return replace(self.base, chunk_size=chunks, broadcast=broadcast)  # once a round

    def broadcast_in(self, view: View | None) -> Broadcast:
        """The one rule for a round's broadcast: as its view says, else as configured."""
        chosen = (view.broadcast if view is not None else "") or self.base.broadcast
        return "fanout" if chosen == "fanout" else "tree"

    def listens_to_fanout(self) -> bool:
        """A fleet may switch to the fan-out (adapt_broadcast): we listen there from the start."""
        return self.base.broadcast == "fanout" or self.adapt_broadcast

    def choose(self, node: int, membership: Membership, downlink: DownlinkRate) -> tuple[list[PublishView], Note | None]:
        """As coordinator: the chunk size and the broadcast the fleet's next rounds use, from
        our downlink; the views that say so and the note about it."""
        view = membership.views.latest
        if not (self.adapt_chunks or self.adapt_broadcast) or view is None or membership.coordinator() != node:
            return [], None
        rate = rate_across_sites(downlink.rate(), view.sites)
        chunks, broadcast = view.chunk_values, view.broadcast
        if self.adapt_chunks:
            chunks = chunk_values_for(rate, chunks, self.base.chunk_size)
        if self.adapt_broadcast and self.base.algorithm == Algorithm.FT_TREE:
            broadcast = broadcast_for(rate, broadcast)
        out = list(membership.change_chunks(chunks, broadcast))
        if not out or rate is None:
            return out, None
        size = chunks or self.base.chunk_size
        how = broadcast or self.base.broadcast
        why = "uplinks between sites" if len(set(view.sites)) > 1 else "downlink"
        return out, Note(NoteKind.CHUNKS, None, f"{size:,} values per chunk, broadcast {how}, from round "
                                                f"{membership.views.newest.from_round}: {why} {rate / 1e6:.1f} MB/s")
