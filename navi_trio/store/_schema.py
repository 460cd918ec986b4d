"""The SQLite schema of the session store: the connection, the tables, the write transaction.

The connection (WAL and pragmas), the tables and their version, ``BEGIN IMMEDIATE``
transactions (`_write_tx`), and `SQLITE`, the engine under the shared statements
(store/statements.py): its write transaction, its fence check, its kv prefix list. What a message
becomes before it reaches a table is `_input`'s (nothing SQLite about it).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from navi_trio.backoff import backoff_delay
from navi_trio.errors import StoreError
from navi_trio.store.fence import Fence, lost
from navi_trio.store.modes import PRIVATE_DIR, private_database
from navi_trio.store.statements import Engine

SCHEMA_VERSION = 2  # 2: leases.generation (store/fence.py)
_HISTORY = ("messages", "context")
_TABLES = ("sessions", "messages", "context", "kv", "users")
# Every table and index `_create` makes, and the columns it adds to older tables: a
# database with all of them needs nothing from it (tests/test_store.py holds
# the list to what `_create` makes).
_SCHEMA_NAMES = frozenset(
    {
        *_TABLES,
        *("leases", "queued", "wakes", "usage", "schedules", "usage_holds", "run_usage"),
        *("sessions_user", "messages_order", "context_order", "users_token"),
        *("queued_session", "wakes_session", "schedules_user", "usage_holds_key"),
        *("run_usage_user", "run_usage_session", "message_keys", "message_keys_order"),
    }
)
_ADDED_COLUMNS = (
    ("leases", "generation"),
    ("leases", "end_owed"),
    ("schedules", "last_skip"),
    ("schedules", "last_skip_at"),
)


def _connect(
    path: Path,
    synchronous: str,
    busy_timeout: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> sqlite3.Connection:
    """The store's connection. SQLite's own autocommit (``isolation_level=None``): a
    statement outside `_write_tx` commits by itself, as sqlite-utils' ``execute`` made it
    do, and the module never opens a transaction of its own."""
    path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    private_database(path)  # before SQLite makes its -wal and -shm: they take its mode
    conn = sqlite3.connect(str(path), timeout=busy_timeout, isolation_level=None)
    try:
        mode = _wal_mode(conn, busy_timeout, sleep)
        if str(mode).lower() != "wal":
            raise StoreError(f"{path}: SQLite refused WAL journal mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        conn.execute("PRAGMA recursive_triggers=on")  # as sqlite-utils' Database set it
        return conn
    except BaseException:
        conn.close()
        raise


def _wal_mode(conn: sqlite3.Connection, busy_timeout: float, sleep: Callable[[float], None]) -> str:
    """``PRAGMA journal_mode=WAL``, tried again while another connection holds the lock.

    Switching a new database (still in rollback mode) to WAL upgrades the statement's read
    lock to a write lock, and SQLite answers ``SQLITE_BUSY`` at once, without its busy
    handler, when another connection holds the write lock meanwhile: several processes
    opening one new database (``navi run`` side by side) would fail "database is locked".
    Once the file is WAL the statement takes no lock and answers at once."""
    deadline = time.monotonic() + busy_timeout
    attempt = 0
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() >= deadline:
                raise
        attempt += 1
        sleep(backoff_delay(attempt, base=0.002, cap=0.1, jitter=0.5))


@contextmanager
def _write_tx(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction that takes the write lock first: ``BEGIN IMMEDIATE``.

    Why not sqlite-utils' ``atomic()`` (a deferred ``BEGIN``): a deferred transaction
    reads first and upgrades to a writer at its first write. In WAL mode, if another
    process committed in between, the upgrade fails at once with "database is locked"
    (SQLITE_BUSY_SNAPSHOT) and the busy timeout is never consulted. Taking the lock at
    BEGIN makes every writer wait its turn for up to the busy timeout instead. Nested
    inside an open transaction (a job of a group commit), this is a savepoint.
    """
    if db.in_transaction:
        db.execute("SAVEPOINT navi_write")
        try:
            yield db
        except BaseException:
            # An error that ended the whole transaction took the savepoint with it.
            if db.in_transaction:
                db.execute("ROLLBACK TO navi_write")
                db.execute("RELEASE navi_write")
            raise
        db.execute("RELEASE navi_write")
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    try:
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _current(db: sqlite3.Connection) -> bool:
    """Whether the database has every table, index and column `_create` makes."""
    rows = db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")
    if not _SCHEMA_NAMES <= {r[0] for r in rows}:
        return False
    for table, column in _ADDED_COLUMNS:
        if (
            db.execute(
                "SELECT 1 FROM pragma_table_info(?) WHERE name = ?", [table, column]
            ).fetchone()
            is None
        ):
            return False
    return True


def _init_schema(db: sqlite3.Connection) -> None:
    """Check the schema's version; make what is missing (a new or an older database).

    A database that has everything is only read: sqlite-utils, which makes the tables,
    is imported when there is something to make (most of `navi run`'s start-up is
    imports).
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the database has schema version {version}; this navi knows {SCHEMA_VERSION}"
        )
    if version == SCHEMA_VERSION and _current(db):
        return
    _create(db)


def _create(conn: sqlite3.Connection) -> None:
    """Every table, index and column the store uses, those already there left alone."""
    from navi_trio.store._sqlite_utils import Database  # without numpy: its docstring

    db = Database(conn, execute_plugins=False)
    with _write_tx(conn):
        db.table("sessions").create(
            {
                "id": str,
                "profile_id": str,
                "title": str,
                "user_id": str,
                "created_at": float,
                "updated_at": float,
                "meta": str,
            },
            pk="id",
            not_null=["profile_id", "title", "user_id", "created_at", "updated_at", "meta"],
            if_not_exists=True,
        )
        db.table("sessions").create_index(
            ["user_id", "updated_at"], index_name="sessions_user", if_not_exists=True
        )
        for table in _HISTORY:
            db.table(table).create(
                {
                    "id": int,
                    "session_id": str,
                    "position": float,
                    "role": str,
                    "content": str,
                    "is_plan": int,
                    "data": str,
                    "created_at": float,
                },
                pk="id",
                not_null=["session_id", "position", "is_plan", "data", "created_at"],
                foreign_keys=[("session_id", "sessions", "id")],
                if_not_exists=True,
            )
            db.table(table).create_index(
                ["session_id", "position"],
                index_name=f"{table}_order",
                unique=True,
                if_not_exists=True,
            )
        db.table("kv").create(
            {"scope": str, "key": str, "value": str, "updated_at": float},
            pk=("scope", "key"),
            not_null=["value", "updated_at"],
            if_not_exists=True,
        )
        db.table("users").create(
            {"id": str, "name": str, "token_sha256": str, "role": str, "created_at": float},
            pk="id",
            not_null=["name", "token_sha256", "role", "created_at"],
            if_not_exists=True,
        )
        db.table("users").create_index(
            ["token_sha256"], index_name="users_token", unique=True, if_not_exists=True
        )
        # Who runs a session right now (store/_lease.py). No foreign key: a run leases
        # its session before the session row exists. Old databases gain the table here.
        db.table("leases").create(
            {
                "session_id": str,
                "owner": str,
                "pid": int,
                "host": str,
                "expires_at": float,
                "generation": int,
                "end_owed": int,
            },
            pk="session_id",
            not_null=["owner", "pid", "host", "expires_at", "generation", "end_owed"],
            defaults={"generation": 0, "end_owed": 0},
            if_not_exists=True,
        )
        have = db.table("leases").columns_dict
        if "generation" not in have:  # a version 1 database
            db.execute("ALTER TABLE leases ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
        # Whether the holder owes the session a turn's end (postgres/migrations/0009).
        if "end_owed" not in have:
            db.execute("ALTER TABLE leases ADD COLUMN end_owed INTEGER NOT NULL DEFAULT 0")
        # Queued user messages (store/_queue.py): `id` is the order they were queued in.
        db.execute(
            "CREATE TABLE IF NOT EXISTS queued (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " key TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL REFERENCES sessions(id),"
            " pid INTEGER NOT NULL, host TEXT NOT NULL, data TEXT NOT NULL,"
            " created_at FLOAT NOT NULL)"
        )
        db.execute("CREATE INDEX IF NOT EXISTS queued_session ON queued (session_id, id)")
        # Control of running agents: wake-ups a background job's
        # note started, the budgets' usage counters, scheduled runs.
        db.execute("CREATE TABLE IF NOT EXISTS wakes (session_id TEXT NOT NULL, at FLOAT NOT NULL)")
        db.execute("CREATE INDEX IF NOT EXISTS wakes_session ON wakes (session_id, at)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS usage (key TEXT PRIMARY KEY, tokens FLOAT NOT NULL,"
            " tool_calls FLOAT NOT NULL, subagents FLOAT NOT NULL, wall_sec FLOAT NOT NULL,"
            " updated_at FLOAT NOT NULL)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS schedules (id TEXT PRIMARY KEY, user_id TEXT NOT NULL,"
            " session_id TEXT, profile_id TEXT, kind TEXT NOT NULL, spec TEXT NOT NULL,"
            " message TEXT NOT NULL, catch_up INTEGER NOT NULL, paused INTEGER NOT NULL,"
            " next_due FLOAT, created_at FLOAT NOT NULL, runs INTEGER NOT NULL,"
            " last_run_at FLOAT, last_session_id TEXT, budget TEXT NOT NULL)"
        )
        db.execute("CREATE INDEX IF NOT EXISTS schedules_user ON schedules (user_id)")
        # Why a schedule's last due time ran nothing (older databases gain the columns).
        # Added columns only: a navi that does not know them still reads and writes.
        have = db.table("schedules").columns_dict
        for column, kind in (("last_skip", "TEXT"), ("last_skip_at", "FLOAT")):
            if column not in have:
                db.execute(f"ALTER TABLE schedules ADD COLUMN {column} {kind}")
        # What the budgets' calls under way hold (`reserve_usage`): one
        # row per hold and key, until settled or expired.
        db.execute(
            "CREATE TABLE IF NOT EXISTS usage_holds (hold TEXT NOT NULL, key TEXT NOT NULL,"
            " tokens FLOAT NOT NULL, tool_calls FLOAT NOT NULL, subagents FLOAT NOT NULL,"
            " wall_sec FLOAT NOT NULL, pid INTEGER NOT NULL, host TEXT NOT NULL,"
            " expires_at FLOAT NOT NULL, PRIMARY KEY (hold, key))"
        )
        db.execute("CREATE INDEX IF NOT EXISTS usage_holds_key ON usage_holds (key)")
        # What each run spent, for the accounts (store/statements.py `record_run_usage`).
        db.execute(
            "CREATE TABLE IF NOT EXISTS run_usage (at FLOAT NOT NULL, day TEXT NOT NULL,"
            " session_id TEXT NOT NULL, user_id TEXT NOT NULL, profile TEXT NOT NULL,"
            " model TEXT NOT NULL, kind TEXT NOT NULL, tokens_in INTEGER NOT NULL,"
            " tokens_out INTEGER NOT NULL, llm_sec FLOAT NOT NULL, tool_sec FLOAT NOT NULL)"
        )
        db.execute("CREATE INDEX IF NOT EXISTS run_usage_user ON run_usage (user_id, at)")
        db.execute("CREATE INDEX IF NOT EXISTS run_usage_session ON run_usage (session_id, at)")
        # The client keys of a session's messages (store/statements.py `claim_key`).
        db.execute(
            "CREATE TABLE IF NOT EXISTS message_keys (session_id TEXT NOT NULL,"
            " key TEXT NOT NULL, message_id TEXT NOT NULL, reply TEXT NOT NULL,"
            " at FLOAT NOT NULL, PRIMARY KEY (session_id, key))"
        )
        # (An index holds the rowid: the session's keys in the order they were taken.)
        db.execute("CREATE INDEX IF NOT EXISTS message_keys_order ON message_keys (session_id)")
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


class SQLiteEngine(Engine):
    """SQLite under the shared statements: ``?``, ``BEGIN IMMEDIATE``, the fence read."""

    def write(self, conn: sqlite3.Connection) -> AbstractContextManager[object]:
        return _write_tx(conn)

    def check_fence(self, conn: sqlite3.Connection, fence: Fence | None) -> None:
        if fence is None:
            return
        row = conn.execute(
            "SELECT owner, generation FROM leases WHERE session_id = ?", [fence.session_id]
        ).fetchone()
        if row is None or (row[0], row[1]) != (fence.owner, fence.generation):
            raise lost(fence, None if row is None else (row[0], row[1]))

    def kv_list(self, conn: sqlite3.Connection, scope: str, prefix: str) -> list[tuple[str, Any]]:
        rows = conn.execute(
            "SELECT key, value FROM kv WHERE scope = ? AND substr(key, 1, ?) = ? ORDER BY key",
            [scope, len(prefix), prefix],
        ).fetchall()
        return [(r[0], json.loads(r[1])) for r in rows]


SQLITE = SQLiteEngine()
