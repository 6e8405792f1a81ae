"""What a simulation tells the person watching it, on stderr: lines, and a bar of the rounds."""

from __future__ import annotations

import sys

from tqdm import tqdm

from simulate.telemetry import FleetWatch


def say(text: str) -> None:
    """One line on stderr that leaves the progress bar whole."""
    tqdm.write(text, file=sys.stderr)


class RoundBar:
    """The rounds done of the run's, with the fleet's mean loss, best accuracy and faults."""

    def __init__(self, rounds: int) -> None:
        self.bar = tqdm(total=rounds, desc="rounds", file=sys.stderr, unit="round", dynamic_ncols=True,
                        mininterval=0.5)

    def show(self, watch: FleetWatch, fleet_round: int, injected: int, faults: int) -> None:
        self.bar.n = min(fleet_round, self.bar.total)
        latest = list(watch.latest.values())
        losses = [t.loss for t in latest if t.loss is not None]
        accs = [(t.round, t.accuracy) for t in latest if t.accuracy is not None]
        self.bar.set_postfix(loss=f"{sum(losses) / len(losses):.3f}" if losses else "-",
                             acc=f"{max(accs)[1]:.3f}" if accs else "-",
                             faults=f"{injected}/{faults}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
