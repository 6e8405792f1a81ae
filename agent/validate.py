"""Checks of command-line values and files, shared by every `edgegrove` command.

Each check returns the value (converted) or raises ``UsageError`` whose message is ONE line
saying what is wrong and what to do. ``arg(check)`` turns a check into an argparse ``type=``,
so a bad value stops the command while its arguments are parsed: before anything starts.
``OneLineParser`` prints argparse's own errors as one line too; every usage error exits 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")
EXIT_USAGE = 2
URL_HINT = "use mqtt://HOST:PORT (or mqtts://HOST:PORT for TLS), e.g. mqtt://127.0.0.1:1883"
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


class UsageError(ValueError):
    """A command-line value or file that cannot be used; the message is one line."""


def one_line(text: str) -> str:
    """Any message as one line (a multi-line one joined with '; ')."""
    parts = [part.strip() for part in str(text).splitlines() if part.strip()]
    joined = parts[0] if parts else ""
    for part in parts[1:]:
        joined += (" " if joined.endswith(":") else "; ") + part
    return joined


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit 2), not the usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (`{self.prog} --help` lists the options)\n")


def arg(check: Callable[[str], T]) -> Callable[[str], T]:
    """``check`` as an argparse ``type=``: a UsageError becomes argparse's error message."""

    def parse(text: str) -> T:
        try:
            return check(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(check, "__name__", "value")
    return parse


# -- numbers --------------------------------------------------------------------------------


def whole(lo: int, hi: int | None = None, what: str = "a number") -> Callable[[str], int]:
    """A whole number in lo..hi (no upper bound when hi is None)."""

    def check(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise UsageError(f"{text!r} is not a whole number: give {what}, {_span(lo, hi)}") from None
        return in_range(value, lo, hi, what)

    check.__name__ = "number"
    return check


def in_range(value: int, lo: int, hi: int | None, what: str) -> int:
    if value < lo or (hi is not None and value > hi):
        raise UsageError(f"{value} is out of range: give {what}, {_span(lo, hi)}")
    return value


def _span(lo: int, hi: int | None) -> str:
    return f"{lo}..{hi}" if hi is not None else f"at least {lo}"


def positive_seconds(text: str) -> float:
    """A duration in seconds, > 0 and finite."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise UsageError(f"{text!r} is not a number of seconds: give e.g. 30 or 0.5") from None
    if not 0 < value < float("inf"):
        raise UsageError(f"{text} is not a usable duration: give a number of seconds > 0")
    return value


def port(text: str) -> int:
    """A TCP port to listen on: 0 (any free one) .. 65535."""
    return whole(0, 65535, "a TCP port (0: any free one)")(text)


# -- addresses --------------------------------------------------------------------------------


def broker_url(text: str) -> str:
    """``mqtt://HOST:PORT`` or ``mqtts://HOST:PORT`` with a port 1..65535 (default 1883/8883)."""
    url = str(text).strip()
    try:
        parts = urlsplit(url)
        number = parts.port
    except ValueError:
        raise UsageError(f"broker URL {text!r} has no valid port (1..65535): {URL_HINT}") from None
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise UsageError(f"{text!r} is not a broker URL: {URL_HINT}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or " " in url:
        raise UsageError(f"broker URL {text!r} has a path, query, user or space in it: {URL_HINT} "
                         "(credentials go in their own options)")
    if number == 0:
        raise UsageError(f"broker URL {text!r} has port 0: give the broker's port, 1..65535")
    return url


def bind_address(text: str) -> str:
    """An address to listen on: an IP address literal or a host name."""
    value = str(text).strip()
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        if _HOSTNAME.match(value):
            return value
    raise UsageError(f"{text!r} is not an address to listen on: give an IP address such as "
                     "127.0.0.1 or 0.0.0.0, or a host name")


# -- files ----------------------------------------------------------------------------------


def input_file(text: str | Path) -> Path:
    """An existing, readable regular file."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise UsageError(f"{path} is a directory: give the path of a file in it")
    if not path.exists():
        raise UsageError(f"{path} does not exist: check the path")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{path} cannot be read: check its permissions")
    return path


def existing_path(text: str | Path) -> Path:
    """A file or directory that exists."""
    path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"{path} does not exist: check the path")
    return path


def input_dir(text: str | Path) -> Path:
    """An existing directory."""
    path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"{path} does not exist: check the path")
    if not path.is_dir():
        raise UsageError(f"{path} is a file: give a directory")
    return path


def output_file(text: str | Path) -> Path:
    """A file path we can write: not a directory, in a directory we can create or write."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise UsageError(f"{path} is a directory: give a file name (e.g. {path / 'out.json'})")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{path} cannot be written: check its permissions or choose another path")
    _writable_parent(path)
    return path


def output_dir(text: str | Path) -> Path:
    """A directory we can write into, or can create."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} is a file, not a directory: give a directory path")
    if path.is_dir():
        _check_writable(path, path)
        return path
    _writable_parent(path)
    return path


def _writable_parent(path: Path) -> None:
    """The nearest existing ancestor of ``path`` is a directory we may write into."""
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{path} cannot be created: {ancestor} is a file, not a directory")
    _check_writable(ancestor, path)


def _check_writable(directory: Path, path: Path) -> None:
    # Try it: os.access says yes to root everywhere, yet root cannot write /proc or a
    # read-only mount. The probe file is anonymous and gone when closed.
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UsageError(f"{path} cannot be written ({directory}: {exc.strerror or exc}): "
                         "choose another path") from None
