"""Test-wide settings.

Property tests (hypothesis) run derandomized by default: the README's test command (and CI)
tries the same examples every time, so a red run is a regression, never a new random draw;
and with no deadline per example, so a busy host does not make one "flaky".
``HYPOTHESIS_PROFILE=explore`` searches at random (1000 examples where a test sets no number), to hunt for
new counterexamples (add each one found as an ``@example``).

``--broadcast tree`` runs the tests with ft-tree's relayed broadcast as the default of
``AllreduceConfig`` and of the agent's configuration (every test that does not name a broadcast
mode: the fault matrix, the property tests, the round machines' tests, the agents' defaults),
to check both modes with the same tests (the default is the fan-out, ``--broadcast fanout``).
"""

from __future__ import annotations

import os

# One BLAS thread per process, set before numpy loads here, in the xdist workers (they inherit
# it) and in every agent or simulator a test starts: OpenBLAS's threads spin while they wait,
# and with two workers (and a fleet's agents) on two cores, a float64 dot of one chunk
# (influence.norm) took 17-50 ms instead of 0.4 ms beside a busy host; the in-memory fleets
# spent 45 % of their time there. Set it yourself to override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gc
from typing import Any

import pytest
from hypothesis import settings

from agent.config import AgentConfig
from agent.protocol.allreduce import BROADCASTS, AllreduceConfig

# No per-example deadline (hypothesis's is 200 ms): a loaded host (a fleet beside the suite)
# makes an example slow once, hypothesis runs it again, fast, and fails the test as Flaky.
# The tests' time is pytest-timeout's to bound.
settings.register_profile("default", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--broadcast", choices=BROADCASTS, default=None,
                     help="ft-tree broadcast mode the tests' AllreduceConfig defaults to")


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(WorkerPeaks(), "edgegrove-worker-peaks")
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


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                   items: list[pytest.Item]) -> None:
    """Files holding slow tests first, each file's tests kept together and in order. Under
    ``--dist loadfile`` (pyproject) a file runs whole on one worker, and with
    ``--no-loadscope-reorder`` xdist hands files out in this order: the long ones start first and
    the many short ones fill the workers' ends, instead of a long file starting last."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the rest keeps its order


# A test's garbage in reference cycles (an in-memory fleet: its agents hold the fleet, the
# bus's queued closures hold the bus) waits for a full collection, which the arrays' bytes
# never trigger: the unit suite reached 7.7 GB. Collect once the process grew this much.
COLLECT_AFTER_GROWTH_MB = 100


def _resident_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0  # not Linux: never collects beyond Python's own


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


_resident_after_collect = [_resident_mb()]


@pytest.hookimpl(trylast=True)  # after the fixtures' finalizers
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _resident_mb() - _resident_after_collect[0] >= COLLECT_AFTER_GROWTH_MB:
        gc.collect()
        _resident_after_collect[0] = _resident_mb()


class WorkerPeaks:
    """Under pytest-xdist: each worker's peak memory, sent to the controller at its end."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        peak = getattr(node, "workeroutput", {}).get("peak_rss_mb")
        if peak is not None:
            self.peaks[node.gateway.id] = peak


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["peak_rss_mb"] = _peak_mb()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The test processes' own peak memory, for CI's log (issue 37: it once reached 9.1 GB)."""
    terminalreporter.write_line(f"pytest process peak resident memory: {_peak_mb():.0f} MB")
    workers = config.pluginmanager.get_plugin("edgegrove-worker-peaks")
    for worker, peak in sorted(getattr(workers, "peaks", {}).items()):
        terminalreporter.write_line(f"pytest worker {worker} peak resident memory: {peak:.0f} MB")
