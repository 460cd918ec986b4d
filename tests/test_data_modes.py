"""navi's data on disk is readable by its own account only, whatever the umask.

A fresh data folder and database made under the usual umask 022 come out 0700 (the data
folder, ``sessions``, a session folder a tool made) and 0600 (the database with its
``-wal`` and ``-shm``); an install made before, with 0755 folders and 0644 files, is
fixed when the runtime opens, and the log says so.

Rules: a real runtime and ApiServer in this process, a real WebSocket client on
127.0.0.1, the fake LLM server over real HTTP scripted to write a file with the
filesystem tool, a real SQLite file. Every test has an absolute time limit.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from agent_tools import call
from api_ws import open_daemon

from navi_trio.settings import Settings
from navi_trio.testing import open_harness
from navi_trio.tools.roots import RunRoots
from navi_trio.tools.runas import session_owner

TIMEOUT = 30


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


async def test_a_new_install_is_private_whatever_the_umask(tmp_path: Path, umask_022: None) -> None:
    data, db = tmp_path / "data", tmp_path / "db" / "navi.db"
    write = call("filesystem", action="write", path="notes.txt", content="secret")
    replies = [write, {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with (
            open_daemon(
                tmp_path,
                replies=replies,
                data_dir=data,
                db_path=db,
                profiles={"general": {"planning_first_message": False}},
            ) as d,  # fmt: skip
            d.connect("alice") as c,
        ):
            ok = await c.request({"type": "message", "content": "write it"})
            sid = ok["session_id"]
            await c.until_end(sid)
            folder = Settings.from_env({}, data_dir=data).session_dir(sid)
            assert (folder / "notes.txt").read_text() == "secret"
            assert {p.name: mode(p) for p in (data, data / "sessions", folder, db.parent)} == {
                "data": 0o700, "sessions": 0o700, sid: 0o700, "db": 0o700,
            }  # fmt: skip
            sides = {p.name: mode(p) for p in db.parent.iterdir() if p.name.startswith("navi.db")}
            assert {"navi.db", "navi.db-wal", "navi.db-shm"} <= sides.keys(), sides
            assert set(sides.values()) == {0o600}, sides


async def test_an_old_install_readable_to_others_is_fixed_at_start_and_logged(
    tmp_path: Path, umask_022: None, caplog: pytest.LogCaptureFixture
) -> None:
    data, db = tmp_path / "data", tmp_path / "navi.db"
    folder = data / "sessions" / "s-0123456789ab"
    folder.mkdir(parents=True)
    grouped = data / "sessions" / "s-0123456789ac"  # open to its group only
    grouped.mkdir(mode=0o750)
    grouped.chmod(0o750)
    conn = sqlite3.connect(db)  # as SQLite makes them under umask 022: 0644
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    try:
        assert mode(db) == 0o644 and mode(Path(f"{db}-wal")) == 0o644
        assert mode(data) == mode(folder) == 0o755
        caplog.set_level(logging.WARNING)
        with trio.fail_after(TIMEOUT):
            async with open_harness(tmp_path, data_dir=data, db_path=db):
                assert mode(data) == mode(data / "sessions") == mode(folder) == 0o700
                assert mode(grouped) == 0o700
                assert mode(db) == mode(Path(f"{db}-wal")) == mode(Path(f"{db}-shm")) == 0o600
    finally:
        conn.close()
    said = [r.getMessage() for r in caplog.records if "made private" in r.getMessage()]
    assert any(str(data) in line and "was 0755" in line for line in said), said
    assert any("2 session folder(s)" in line for line in said), said
    assert any("navi.db (was 0644)" in line and "navi.db-wal (was 0644)" in line for line in said)


async def test_a_session_folder_a_fork_makes_is_private_and_its_tool_users(
    tmp_path: Path, umask_022: None
) -> None:
    # B, a fork without files, has no folder until it runs; a fork of B with its files
    # makes it (to snapshot it) as a run would: 0700, the tool user's when we are root.
    data = tmp_path / "data"
    replies = [call("filesystem", action="write", path="a.txt", content="a"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with (
            open_daemon(tmp_path, replies=replies, data_dir=data) as d,
            d.connect("alice") as c,
        ):
            ok = await c.request({"type": "message", "content": "write it"})
            await c.until_end(ok["session_id"])
            b = await c.request({"type": "fork", "session_id": ok["session_id"]})
            folder_b = d.harness.runtime.settings.session_dir(b["new_session_id"])
            assert not folder_b.exists()
            made = await c.request(
                {"type": "fork", "session_id": b["new_session_id"], "files": True}
            )
            assert made["type"] == "fork", made
            folder_c = d.harness.runtime.settings.session_dir(made["new_session_id"])
            owner = session_owner(d.harness.runtime.settings.tool_user)
            assert mode(folder_b) == mode(folder_c) == mode(data / "sessions") == 0o700
            st = os.stat(folder_b)
            assert (st.st_uid, st.st_gid) == (owner or (os.geteuid(), os.getegid()))


def test_a_tool_driven_alone_makes_the_session_folders_private(
    tmp_path: Path, umask_022: None
) -> None:
    # No runtime made the data folder private first (a tool driven without a run): the
    # session folder and `sessions` above it are made 0700 all the same.
    folder = tmp_path / "data" / "sessions" / "s-1"
    roots = RunRoots.open(folder, None)
    try:
        assert roots.error is None, roots.error
    finally:
        roots.close()
    assert mode(folder) == mode(folder.parent) == 0o700
