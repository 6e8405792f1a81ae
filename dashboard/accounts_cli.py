"""`edgegrove accounts`: the dashboard's named operator accounts (add, remove, list).

    edgegrove accounts add ana --role operator --file accounts.json   # asks for the password
    edgegrove accounts list --file accounts.json
    edgegrove accounts remove ana --file accounts.json

The password is read from $EDGEGROVE_ACCOUNT_PASSWORD if set (scripts), else asked twice.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from dashboard.accounts import (
    Account,
    Role,
    load_accounts,
    save_accounts,
    validate_name,
    with_account,
)

DESCRIPTION = __doc__.split("\n\n")[0] if __doc__ else ""
PASSWORD_ENV = "EDGEGROVE_ACCOUNT_PASSWORD"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("add", "remove", "list"), help="what to do")
    parser.add_argument("name", nargs="?", help="the account (add, remove)")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.VIEWER.value,
                        help="viewer reads; operator also injects faults and controls jobs")
    parser.add_argument("--file", type=Path, required=True, metavar="FILE",
                        help="the accounts file (the dashboard's --accounts); add creates it")


def run(args: argparse.Namespace) -> int:
    try:
        accounts = load_accounts(args.file) if args.file.exists() or args.action != "add" else {}
        if args.action == "list":
            for account in accounts.values():
                print(f"{account.name}\t{account.role.value}")
            return 0
        if args.name is None:
            raise ValueError(f"accounts {args.action} needs the account's NAME")
        validate_name(args.name)
        save_accounts(args.file, _changed(args, accounts))
    except ValueError as exc:
        print(f"edgegrove accounts: {exc}", file=sys.stderr)
        return 2
    print(f"accounts: {args.action} {args.name} ({args.file})")
    return 0


def _changed(args: argparse.Namespace, accounts: dict[str, Account]) -> dict[str, Account]:
    if args.action == "remove":
        if args.name not in accounts:
            raise ValueError(f"no account {args.name!r} in {args.file}")
        return {n: a for n, a in accounts.items() if n != args.name}
    return with_account(accounts, args.name, Role(args.role), _password(args.name))


def _password(name: str) -> str:
    given = os.environ.get(PASSWORD_ENV)
    if given is not None:
        return given
    first = getpass.getpass(f"password for {name}: ")
    if getpass.getpass("again: ") != first:
        raise ValueError("the two passwords differ")
    return first
