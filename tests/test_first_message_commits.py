"""What a new session's first message waits for the disk for before its run starts.

The message itself is saved with an fsync before its ok, as every message is. The
session row, the folder remembered for the folder picker, the run's lease and the
title are committed without one: the message's own fsync'd save flushes SQLite's log
behind them, and a title or a picker entry lost to a power cut costs only itself.

Rules: a real daemon on 127.0.0.1 port 0, real SQLite, the fake LLM over real HTTP, an
absolute timeout, no sleeps.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import open_daemon
from rewind_kit import TIMEOUT, say
from test_api_workspace import message
from test_rewind_asker import config_at

from navi_trio.store import _worker
from navi_trio.store._worker import _Job


async def test_a_new_sessions_first_message_waits_for_one_fsync_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    projects = (tmp_path / "projects").resolve()
    projects.mkdir()
    source = config_at(tmp_path / "config" / "config.json", [str(projects)])
    writes: list[tuple[str, bool]] = []  # (what, fsync'd) of each job that changed rows
    execute = _Job.execute

    def recording(self: _Job[Any], db: sqlite3.Connection | None, error: Any) -> None:
        execute(self, db, error)
        if self.wrote:
            writes.append((self.op.split(" '")[0].split("/")[0], self.durable))

    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[say("done")], config=source) as d:
            monkeypatch.setattr(_worker._Job, "execute", recording)
            async with d.connect("alice") as alice:
                sid = await message(alice, "hello there", projects)
            store = d.harness.runtime.store
            row = await store.get_session(sid)
            assert row is not None and row.title == "hello there"
            assert await store.kv_get("recent_folders", d.ids["alice"]) == [str(projects)]
    first = writes.index(("append to session", True))  # the user's message
    assert writes[: first + 1] == [
        ("create session", False),
        ("kv set recent_folders", False),
        ("claim lease of", False),
        ("append to session", True),
    ], writes
    assert [w for w in writes if w[0] == "update session"] == [("update session", False)]
