"""`edgegrove agent`: one edge agent against an MQTT broker.

Options come from flags, EDGEGROVE_* environment variables or a TOML file (--config), in
that order of precedence. SIGTERM/SIGINT end the agent cleanly: it abandons the round in
flight, publishes `offline` and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

from agent.config import AgentConfig, ConfigError, check_paths, load_config
from agent.validate import OneLineParser

if TYPE_CHECKING:
    from agent.runtime import TransportWrapper

DESCRIPTION = __doc__


def _flag_type(annotation: Any) -> tuple[Any, list[str] | None]:
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin is not None and str(origin).endswith("Literal"):
        return str, [str(a) for a in args]
    if args and all(str(get_origin(a)).endswith("Literal") for a in args):
        return str, [str(x) for a in args for x in get_args(a)]
    if any(str(get_origin(a)).endswith("Literal") for a in args):
        return str, None  # a number or a word (sync-every 8 | auto): the configuration checks it
    base = args[0] if args else annotation
    if base is bool:
        return bool, None
    return (base if base in (int, float, str, Path) else str), None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="TOML file with any of the options below")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    for name, field in AgentConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind, choices = _flag_type(field.annotation)
        default_text = "required" if field.is_required() else f"default: {field.default}"
        help_text = f"{field.description} ({default_text}; env {'EDGEGROVE_' + name.upper()})"
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=kind, choices=choices, default=None, help=help_text)


def run(args: argparse.Namespace, wrap_transport: TransportWrapper | None = None) -> int:
    """Run the agent the flags describe; ``wrap_transport`` decorates its MQTT transport."""
    logging.basicConfig(
        level=getattr(logging, args.log_level), stream=sys.stderr,
        format="%(asctime)s agent %(levelname)s %(message)s",
    )
    from agent.runtime_config import member_keys

    flags = {k: v for k, v in vars(args).items() if k in AgentConfig.model_fields}
    try:
        config = load_config(flags, args.config)
        check_paths(config)
        member_keys(config)  # unusable keys: one line before anything starts
    except ConfigError as exc:
        print(f"edgegrove agent: {exc}", file=sys.stderr)
        return 2
    from agent.runtime import run_agent

    return run_agent(config, wrap_transport)


def main(argv: list[str] | None = None, wrap_transport: TransportWrapper | None = None) -> int:
    parser = OneLineParser(prog="edgegrove agent", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv), wrap_transport)


if __name__ == "__main__":
    sys.exit(main())
