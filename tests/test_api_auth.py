"""Tokens: the local admin token file (0600, kept across restarts, replaced when stale;
each data folder's its own user) and which token a client uses (--token, then
NAVI_TOKEN, then the file)."""

from __future__ import annotations

import base64
import fcntl
import os
from pathlib import Path

import pytest
import trio

from navi_trio.api.auth import (
    LOCAL_ADMIN,
    _lock_folder,
    authenticate,
    ensure_local_token,
    folder_admin_name,
    is_loopback,
    new_token,
    read_local_token,
    resolve_token,
)
from navi_trio.errors import AuthError, ConfigError
from navi_trio.store.sqlite import SQLiteStore

TIMEOUT = 30


async def test_the_local_token_file_is_private_kept_and_replaced_when_stale(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            path = await ensure_local_token(store, data)
            assert path.stat().st_mode & 0o777 == 0o600
            token = read_local_token(data)
            assert token is not None
            user = await authenticate(store, token)
            assert (user.name, user.role) == (LOCAL_ADMIN, "admin")
            # A second start keeps it: clients configured with it go on working.
            path.chmod(0o644)
            await ensure_local_token(store, data)
            assert read_local_token(data) == token
            assert path.stat().st_mode & 0o777 == 0o600
            # A file whose token the store does not know (another DB) is replaced.
            path.write_text("navi_stale\n")
            await ensure_local_token(store, data)
            fresh = read_local_token(data)
            assert fresh not in (None, token, "navi_stale")
            assert [u["name"] for u in await store.list_users()] == [LOCAL_ADMIN]
            with pytest.raises(AuthError, match="unknown token"):
                await authenticate(store, token)


async def test_data_folders_on_one_database_each_keep_a_token_of_their_own(
    tmp_path: Path,
) -> None:
    """Two machines (two data folders) on one database: starting one never breaks the
    other's token file; a folder whose token is lost gets a new one for its own user."""
    one, two = tmp_path / "one", tmp_path / "two"
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            for _ in range(2):  # each start of each, in turn
                await ensure_local_token(store, one)
                await ensure_local_token(store, two)
            first, second = read_local_token(one), read_local_token(two)
            assert first is not None and second is not None and first != second
            users = {(await authenticate(store, t)).name for t in (first, second)}
            assert users == {LOCAL_ADMIN, folder_admin_name(two)}
            # Two's token lost: a new one for its own user; one's still works.
            (two / "local-token").unlink()
            await ensure_local_token(store, two)
            fresh = read_local_token(two)
            assert fresh not in (None, second)
            assert (await authenticate(store, fresh or "")).name == folder_admin_name(two)
            assert (await authenticate(store, first)).name == LOCAL_ADMIN
            with pytest.raises(AuthError, match="unknown token"):
                await authenticate(store, second)
            assert len(await store.list_users()) == 2
            # A local-user file naming a user who is not an admin is never acted on: that
            # user's token stays theirs, and the folder's own admin gets the new one.
            await store.create_user("bob", "bob-token")
            (two / "local-user").write_text("bob\n")
            (two / "local-token").unlink()
            await ensure_local_token(store, two)
            assert (await authenticate(store, "bob-token")).name == "bob"
            again = await authenticate(store, read_local_token(two) or "")
            assert (again.name, again.role) == (folder_admin_name(two), "admin")


def test_a_client_token_comes_from_the_flag_then_the_env_then_the_file(tmp_path: Path) -> None:
    (tmp_path / "local-token").write_text("from-file\n")
    assert resolve_token("flag", tmp_path, {"NAVI_TOKEN": "env"}) == "flag"
    assert resolve_token(None, tmp_path, {"NAVI_TOKEN": "env"}) == "env"
    assert resolve_token(None, tmp_path, {}) == "from-file"
    with pytest.raises(ConfigError, match="--token.*NAVI_TOKEN.*navi serve"):
        resolve_token(None, tmp_path / "nowhere", {})


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.2", False),
        ("example.org", False),
        ("localhost.example.org", False),
    ],
)
def test_only_localhost_and_loopback_addresses_count_as_this_machine(
    host: str, local: bool
) -> None:
    # `navi serve --host` and the daemon's own names both ask this one question.
    assert is_loopback(host) is local


def test_a_token_is_256_random_bits() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert token.startswith("navi_")
        assert len(base64.urlsafe_b64decode(token.removeprefix("navi_") + "=")) == 32


def test_one_worker_of_a_folder_writes_its_token_file_at_a_time(tmp_path: Path) -> None:
    # Workers of one data folder write the token file under the folder's lock: while
    # one holds it, another can take it in no way, not even to share it.
    held = _lock_folder(tmp_path)
    other = os.open(tmp_path / "local-token.lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.close(held)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the first is done
    finally:
        os.close(other)
