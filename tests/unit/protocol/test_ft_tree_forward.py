"""The FT-tree passes a final chunk on as it came: the same payload, not a re-quantized copy."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import DType, Flag, Frame, Kind

TREE = Tree((0, 1, 2, 3, 4), 2)  # 1 is inner: children 3 and 4


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I8])
def test_an_inner_node_forwards_the_parents_payload_unchanged(dtype: DType) -> None:
    cfg = AllreduceConfig(chunk_size=8, wire_dtype=dtype, timeout_mode="fixed", fixed_timeout=0.1,
                          broadcast="tree")
    inner = FtTreeRound(RoundContext(cfg, TREE, 1, 0, np.zeros(8, np.float32), 0, cfg.new_links(), 0.0))
    inner.start(0.0)
    values = np.linspace(-3, 3, 8, dtype=np.float32)
    final = Frame(Kind.DATA, 0, 0, 0, 0, 1, Flag.BROADCAST | Flag.FINAL,
                  contributors=frozenset(range(5))).with_values(values, dtype)
    out = inner.on_frame(final, 0.01)
    down = [a for a in out if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert sorted(a.dst for a in down) == [3, 4]
    assert all(a.frame.payload is final.payload and a.frame.scale == final.scale for a in down)
    assert inner.result is not None and inner.result.values.tolist() == final.values().tolist()


def test_the_root_applies_exactly_what_it_sends() -> None:
    cfg = AllreduceConfig(chunk_size=8, wire_dtype=DType.F16, timeout_mode="fixed", fixed_timeout=0.1,
                          broadcast="tree")
    root = FtTreeRound(RoundContext(cfg, Tree((0, 1), 2), 0, 0, np.full(8, 0.1, np.float32), 0,
                                    cfg.new_links(), 0.0))
    root.start(0.0)
    up = Frame(Kind.DATA, 0, 0, 1, 0, 1, contributors=frozenset({1})).with_values(
        np.full(8, 0.2, np.float32), DType.F16)
    sent = [a.frame for a in root.on_frame(up, 0.01) if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert root.result is not None and len(sent) == 1
    assert root.result.values.tolist() == sent[0].values().tolist()
