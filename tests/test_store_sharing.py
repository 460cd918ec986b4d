"""Two processes on one database: write transactions wait for the lock instead of failing.

Deterministic: the "other process" is a second sqlite3 connection that writes at the
worst moment (inside our transaction, between its first read and its first write),
driven from a trace callback on our connection. No threads, no sleeps.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from navi_trio.store._schema import _connect, _init_schema, _prepare
from navi_trio.store.base import SessionRow
from navi_trio.store.sqlite import _append, _insert_session


def test_a_write_transaction_takes_the_write_lock_before_it_reads(tmp_path: Path) -> None:
    path = tmp_path / "navi.db"
    db = _connect(path, "FULL", 0.05)
    _init_schema(db)
    _insert_session(db, SessionRow("s-1", "default", "", "local", 1.0, 1.0), "{}")
    other = sqlite3.connect(str(path), timeout=0, isolation_level=None)
    seen: list[str] = []

    def other_process_writes(sql: str) -> None:
        # Fires when our append has read (the session check) and is about to write.
        if "MAX(position)" not in sql or seen:
            return
        try:
            other.execute("INSERT INTO kv (scope, key, value, updated_at) VALUES ('a','b','1',1)")
            seen.append("the other writer went first")
        except sqlite3.OperationalError as exc:
            seen.append(f"the other writer waits: {exc}")

    db.conn.set_trace_callback(other_process_writes)
    rows = _prepare([{"role": "user", "content": "hi"}], "messages")
    # A deferred BEGIN would fail here with "database is locked" (its snapshot went
    # stale when the other writer committed, and the busy timeout does not apply).
    _append(db, "s-1", rows, rows, 2.0)
    db.conn.set_trace_callback(None)
    assert seen == ["the other writer waits: database is locked"]
    # Our commit released the lock: the other writer goes now.
    other.execute("INSERT INTO kv (scope, key, value, updated_at) VALUES ('a','b','1',1)")
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1
    other.close()
    db.close()
