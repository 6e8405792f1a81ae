"""`edgegrove device --config device.toml`: this device, installed once, runs the jobs it is given.

It publishes its retained record (labels, machine, backends, its data sources' names, sizes and
label histograms; never the data), takes the jobs signed by an operator key it trusts, one at a
time in submitted order, reports each execution's state, and stays up between jobs. Node ids,
fleet size, model and hyper-parameters come from the job, never from flags. SIGTERM/SIGINT end
it; a job in progress resumes at the next start (docs/DEVICES.md).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agent.config import ConfigError
from agent.validate import OneLineParser

if TYPE_CHECKING:
    from agent.runtime import TransportWrapper

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="the device's device.toml")
    parser.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="overrides log_level of the config")


def run(args: argparse.Namespace, wrap_transport: TransportWrapper | None = None) -> int:
    """Run the device the config describes; ``wrap_transport`` decorates each job's transport."""
    from agent.device.config import load_device_config

    try:
        config, keys = load_device_config(args.config)
    except ConfigError as exc:
        print(f"edgegrove device: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, args.log_level or config.log_level), stream=sys.stderr,
                        format="%(asctime)s device %(levelname)s %(message)s")
    from agent.device import facts
    from agent.device.core import DeviceCore
    from agent.device.daemon import DeviceDaemon, capabilities
    from agent.device.verifier import Verifier

    device_facts = facts.gather(config, time.time())
    core = DeviceCore(capabilities(config, device_facts), time.time())
    daemon = DeviceDaemon(config, core, device_facts, Verifier(keys), wrap_transport=wrap_transport)

    def _on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("edgegrove.device").info("signal %d: finishing", signum)
        daemon.shutdown.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    logging.getLogger("edgegrove.device").info(
        "device %s: data %s, backends %s, %d operator key(s)", config.id,
        ", ".join(f"{n} ({i.samples} samples)" for n, i in device_facts.data.items()) or "none",
        ", ".join(device_facts.backends), len(keys))
    return daemon.run()


def main(argv: list[str] | None = None, wrap_transport: TransportWrapper | None = None) -> int:
    parser = OneLineParser(prog="edgegrove device", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv), wrap_transport)


if __name__ == "__main__":
    sys.exit(main())
