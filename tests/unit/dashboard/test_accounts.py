"""The operator accounts file: scrypt hashes, roles, and what a bad file says."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from dashboard.accounts import (
    Role,
    hash_password,
    load_accounts,
    save_accounts,
    verify_password,
    with_account,
)


def test_a_hash_verifies_its_password_only() -> None:
    stored = hash_password("correct horse")
    assert stored.startswith("scrypt$16384$8$1$") and "correct horse" not in stored
    assert verify_password(stored, "correct horse")
    assert not verify_password(stored, "correct hors")
    assert hash_password("correct horse") != stored  # salted
    assert not verify_password("scrypt$1$not-a-hash", "correct horse")
    assert not verify_password("md5$16384$8$1$AAAA$AAAA", "correct horse")


def test_accounts_round_trip_through_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    path = tmp_path / "accounts.json"
    accounts = with_account(with_account({}, "ana", Role.OPERATOR, "ana-password"), "vic", Role.VIEWER, "vic-password")
    save_accounts(path, accounts)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_accounts(path)
    assert {n: a.role for n, a in loaded.items()} == {"ana": Role.OPERATOR, "vic": Role.VIEWER}
    assert verify_password(loaded["ana"].password_hash, "ana-password")
    assert Role.OPERATOR.may_act and not Role.VIEWER.may_act


@pytest.mark.parametrize(("content", "says"), [
    ("not json", "is not JSON"),
    ('{"users": []}', '{"accounts"'),
    ('{"accounts": [{"name": "ana"}]}', '"name", "role" and "password"'),
    ('{"accounts": [{"name": "ana", "role": "root", "password": "scrypt$x"}]}', "role 'root'"),
    ('{"accounts": [{"name": "ana", "role": "viewer", "password": "hunter22"}]}', "never the password itself"),
    ('{"accounts": [{"name": "Ana!", "role": "viewer", "password": "scrypt$x"}]}', "is not valid"),
])
def test_a_bad_accounts_file_says_what_is_wrong(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "accounts.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=None) as caught:
        load_accounts(path)
    assert says in str(caught.value)


def test_an_account_listed_twice_is_refused(tmp_path: Path) -> None:
    entry = {"name": "ana", "role": "viewer", "password": hash_password("ana-password")}
    path = tmp_path / "accounts.json"
    path.write_text(json.dumps({"accounts": [entry, entry]}))
    with pytest.raises(ValueError, match="listed twice"):
        load_accounts(path)


def test_a_short_password_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        hash_password("short")
