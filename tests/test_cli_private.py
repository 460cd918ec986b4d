"""A command's private server: with no daemon answering, a `navi` command serves itself
privately (cli/serve.py `serve_privately`) and speaks the same WebSocket protocol to it.

It knows one user, the person at the shell as the local admin, by a token made for the
process: no user of the store gets in, not even an admin.

Rules: real WebSocket connections on 127.0.0.1 (port 0), the DB under tmp_path, an
absolute deadline on every test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from navi_trio.api.daemon_client import open_daemon
from navi_trio.cli.common import config_source
from navi_trio.cli.serve import serve_privately
from navi_trio.errors import RemoteError
from navi_trio.settings import Settings
from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow
DEADLINE = 90


async def test_a_private_server_knows_only_its_own_token_and_acts_as_the_local_admin(
    tmp_path: Path,
) -> None:
    db = tmp_path / "navi.db"
    async with SQLiteStore.open(db) as store:
        await store.create_user("root", "root-token", role="admin")
    settings = Settings.from_env({}, db_path=db, data_dir=tmp_path / "data")
    with trio.fail_after(DEADLINE):
        async with serve_privately(settings, config_source(settings)) as private:
            assert private.url.startswith("ws://127.0.0.1:") and private.token.startswith("navi_")
            async with open_daemon(private.url, private.token) as daemon:
                assert daemon.welcome["user"] == {"name": "local", "role": "admin"}
            for token in ("root-token", private.token + "x", ""):
                with pytest.raises(RemoteError) as refused:
                    async with open_daemon(private.url, token):
                        pass
                assert refused.value.code == "unauthorized", token
    assert "root-token" not in repr(private)
