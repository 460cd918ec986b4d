"""A corrupt page in the middle of the database (issue 17, "Weaker than it should be").

The start-up check (PRAGMA quick_check, bounded in time) says in one log line that the
file is damaged, `navi doctor` says it too, and a session whose rows cannot be read
refuses new messages (error `storage`, naming the session and the damage) while the
other sessions work.

The damage is real: garbage written over one leaf page of the `messages` table's b-tree,
in the middle of one session's rows (found with the `dbstat` table), of a real SQLite
file. Rules: real WebSocket connections on 127.0.0.1 (port 0), the fake LLM over real
HTTP, no sleeps, every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import random
import sqlite3
from pathlib import Path

import pytest
import trio
from api_ws import open_daemon

from navi_trio.api.auth import new_token
from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.settings import Settings
from navi_trio.store import SQLiteStore
from navi_trio.store._health import quick_check

TIMEOUT = 30
NO_PLAN = {"general": {"planning_first_message": False}}  # one LLM call per message
HEADER = 8  # bytes of a b-tree leaf page's header, kept so the damage reads as cells


async def _build(db: Path) -> str:
    """Sessions A (40 messages, one page each) and B (5) of one user; their token."""
    token = new_token()
    async with SQLiteStore.open(db) as store:
        owner = await store.create_user("owner", token)
        for sid, count in (("A", 40), ("B", 5)):
            await store.create_session(sid, profile_id="general", user_id=owner["id"])
            for n in range(count):
                said = {"role": "user", "content": f"{sid}{n} " + sid.lower() * 1500}
                await store.append(sid, messages=[said], context=[said])
    return token


def _damage_a_page_of_a(db: Path) -> int:
    """Write garbage over the leaf page holding A's 20th message; the page's number."""
    assert not db.with_name(db.name + "-wal").exists()  # everything is in the main file
    with contextlib.closing(sqlite3.connect(db)) as conn:
        leaves = [r[0] for r in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf'"
            " ORDER BY path"
        )]  # fmt: skip
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    page = leaves[19]  # rows in rowid order: A's 40 come first, one per page
    with db.open("r+b") as f:
        f.seek((page - 1) * size + HEADER)
        f.write(random.Random(17).randbytes(size - HEADER))
    return int(page)


async def test_a_damaged_session_refuses_messages_and_the_others_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="navi_trio.store")
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        token = await _build(db)
        _damage_a_page_of_a(db)
        async with open_daemon(tmp_path, profiles=NO_PLAN, replies=[{"text": "B is fine"}]) as d:
            # Said once, at start-up, before any message.
            (warning,) = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
            assert "quick_check" in warning and str(db) in warning
            d.tokens["owner"] = token
            async with d.connect("owner") as c:
                refused = await c.request({"type": "message", "content": "hi", "session_id": "A"})
                assert (refused["type"], refused["code"], refused["session_id"]) == (
                    "error",
                    "storage",
                    "A",
                )
                assert "'A'" in refused["message"] and "damaged" in refused["message"]
                ok = await c.request({"type": "message", "content": "hi", "session_id": "B"})
                assert ok["type"] == "ok"
                end = await c.until(lambda f: f["type"] == "stream_end" and f["session_id"] == "B"
                                    and f.get("reason") != "error")  # fmt: skip
                assert end["text"] == "B is fine"
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": "B"}
                )
                assert [m["content"] for m in history["messages"]][-2:] == ["hi", "B is fine"]
                assert len(d.harness.chat_requests) == 1  # A's message never reached the model
        # `navi doctor` reports it, from a read-only look at the file.
        settings = Settings.from_env(
            {}, db_path=db, data_dir=tmp_path / "data", llm_url="http://127.0.0.1:9"
        )
        report = await collect_doctor(settings, "ws://127.0.0.1:9/")
    check = report["db"]["check"]
    assert check["ok"] is False and check["done"] is True and check["problems"]
    assert any("is damaged" in e for e in report["errors"])
    out = io.StringIO()
    print_doctor(report, out)
    assert "is damaged: PRAGMA quick_check found" in out.getvalue()


def test_the_start_up_check_is_bounded_in_time(tmp_path: Path) -> None:
    db = tmp_path / "big.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE t (n INTEGER, s TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", ((n, "x" * 200) for n in range(5000)))
        conn.execute("CREATE INDEX t_n ON t (n)")
        conn.commit()
        assert quick_check(conn, seconds=60) == []
        # No time at all: the check stops at its first look at the clock, and says so.
        assert quick_check(conn, seconds=0) is None
        assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 5000  # still usable
