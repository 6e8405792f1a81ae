"""Test-wide settings.

Property tests (hypothesis) run derandomized by default: the README's test command (and CI)
tries the same examples every time, so a red run is a regression, never a new random draw.
``HYPOTHESIS_PROFILE=explore`` searches at random (1000 examples where a test sets no number), to hunt for
new counterexamples (add each one found as an ``@example``).

``--broadcast tree`` runs the tests with ft-tree's relayed broadcast as the default of
``AllreduceConfig`` and of the agent's configuration (every test that does not name a broadcast
mode: the fault matrix, the property tests, the round machines' tests, the agents' defaults),
to check both modes with the same tests (the default is the fan-out, ``--broadcast fanout``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from agent.config import AgentConfig
from agent.protocol.allreduce import BROADCASTS, AllreduceConfig

settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--broadcast", choices=BROADCASTS, default=None,
                     help="ft-tree broadcast mode the tests' AllreduceConfig defaults to")


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("--broadcast")
    if mode is None:
        return
    # The dataclass keeps its defaults in __init__'s: the last field is ``broadcast``.
    defaults = AllreduceConfig.__init__.__defaults__
    assert defaults is not None and defaults[-1] in BROADCASTS
    AllreduceConfig.__init__.__defaults__ = (*defaults[:-1], mode)
    assert AllreduceConfig().broadcast == mode
    AgentConfig.model_fields["broadcast"].default = mode
    AgentConfig.model_rebuild(force=True)
    assert AgentConfig(id=0).broadcast == mode


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The test process's own peak memory, for CI's log (issue 37: it once reached 4.5 GB)."""
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    terminalreporter.write_line(f"pytest process peak resident memory: {peak_mb:.0f} MB")
