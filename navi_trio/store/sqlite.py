"""The SQLite session store: one file, WAL, every database touch on one worker thread.

    async with SQLiteStore.open(path) as store:
        row = await store.create_session(profile_id="default")
        await store.append(row.id, messages=[msg], context=[msg])

Why one dedicated thread: sqlite3 connections belong to the thread that made them, and
serialising every call through one queue means no two writes ever race for the file's
lock, while trio never blocks on disk I/O. A caller awaits its job's `trio.Event`, set
from the thread via the caller's trio token.

Cancellation: a job is queued before its caller waits. A caller cancelled while waiting
stops waiting, but the job is not withdrawn: a queued write still completes (the
agent's shielded clean-up relies on a save it started landing on disk). Leaving
`open()` drains every queued job before the connection closes.

Durability: ``synchronous=FULL`` by default. In WAL mode NORMAL already survives a
killed process; FULL adds an fsync per commit so a commit that returned also survives
power loss or an OS crash. Saves come at chat speed (a few per turn), so the fsync is
cheap and the design's promise, "a crash loses at most the message being streamed",
holds for every kind of crash. Pass ``synchronous="NORMAL"`` to trade that for speed.
An `append(durable=False)` (the agent's tool-call message, saved just before its calls
run) commits without the fsync: it survives a killed process at once, and power loss
once the next durable commit (that round's results) has flushed the log.
Jobs already queued when the worker takes the next one share one transaction (group
commit, see `_worker`): many sessions saving at once pay one fsync, and each caller is
still answered only after the commit that holds its write.

When the file is unwell (`_health`): a full disk, a read-only or failing file, a damaged
page raise `StorageFullError` / `StorageError` naming the operation; each condition is
one line in the log when it starts (and one when writes succeed again), not one per
request. Opening runs ``PRAGMA quick_check``, bounded in time (`damage` keeps what it
found): a damaged file starts, says so once, and only what cannot be read is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio
from sqlite_utils import Database

from navi_trio.errors import StorageError, StorageFullError, StoreError
from navi_trio.store._health import (
    _DAMAGED,
    QUICK_CHECK_SEC,
    check_summary,
    failure,
    primary_code,
    quick_check,
)
from navi_trio.store._lease import _claim, _release, _renew
from navi_trio.store._queue import _adopt, _enqueue, _queued_sessions, _unqueue
from navi_trio.store._schema import (
    _HISTORY,
    _SESSION_COLS,
    _TABLES,
    _dump,
    _init_schema,
    _prepare,
    _Row,
    _session_from,
    _write_tx,
)
from navi_trio.store._schema import SCHEMA_VERSION as SCHEMA_VERSION
from navi_trio.store._worker import BUSY_TIMEOUT_S as BUSY_TIMEOUT_S
from navi_trio.store._worker import _Job, _Worker
from navi_trio.store.base import LeaseRow, LoadedSession, SessionRow
from navi_trio.store.repair import repair_dangling_tool_calls
from navi_trio.text import loads_clean

logger = logging.getLogger(__name__)

T = TypeVar("T")
_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+=-]{0,127}")
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_ID_SHOWN_MAX = 60  # an error message quotes at most this much of a bad session id


def check_session_id(session_id: object) -> str:
    """`session_id` if it is a valid id; StoreError naming it (cut when long) if not."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        if isinstance(session_id, str) and not session_id:
            raise StoreError("the session id is empty")
        shown = repr(session_id)
        if len(shown) > _ID_SHOWN_MAX:
            size = f"{len(session_id)} characters" if isinstance(session_id, str) else "long"
            shown = f"{shown[: _ID_SHOWN_MAX - 1]}… ({size})"
        raise StoreError(
            f"invalid session id {shown}: use 1-128 letters, digits or . _ @ + = -"
            " (not starting with . @ + = -)"
        )
    return session_id


_check_session_id = check_session_id  # the name the methods below use


def _check_text(value: object, name: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise StoreError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _check_meta(meta: object) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise StoreError(f"session meta must be a dict, not {type(meta).__name__}")
    return meta


class SQLiteStore:
    """The session store on one SQLite file. Create it with `SQLiteStore.open(path)`."""

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        if synchronous.upper() not in _SYNCHRONOUS:
            raise StoreError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        self._synchronous = synchronous.upper()
        self._worker: _Worker | None = None
        self._closed = False
        self._last_now = 0.0
        # Storage failures already logged ("full", "unwritable", "damaged <op>"): one
        # line when a condition starts, not one per request, until it ends (`_run`).
        self._reported: set[str] = set()
        # What PRAGMA quick_check found at open: [] none, None not finished in time.
        self.damage: list[str] | None = []

    def _now(self) -> float:
        # Strictly increasing, so "newest updated first" never depends on clock resolution.
        self._last_now = max(time.time(), self._last_now + 1e-6)
        return self._last_now

    @classmethod
    def open(
        cls, path: Path | str, *, synchronous: str = "FULL", close_timeout: float = 10.0
    ) -> AbstractAsyncContextManager[SQLiteStore]:
        """Open (creating the parent folders, WAL and schema) and close on exit.

        At exit, queued jobs are drained and the connection closed, shielded from
        cancellation and bounded by `close_timeout` seconds of real time (a thread join,
        so a test's virtual clock cannot cut it short).
        """
        return cls._open(Path(path), synchronous, close_timeout)

    @classmethod
    @asynccontextmanager
    async def _open(
        cls, path: Path, synchronous: str, close_timeout: float
    ) -> AsyncIterator[SQLiteStore]:
        store = cls(path, synchronous=synchronous)
        worker = _Worker(store.path, store._synchronous)
        worker.thread.start()
        store._worker = worker
        try:
            await store._run(f"open store {path}", _init_schema)
            await store._check()
            yield store
        finally:
            with trio.CancelScope(shield=True):
                await store._close(close_timeout)

    async def _close(self, join_seconds: float) -> None:
        worker = self._worker
        if worker is None or self._closed:
            return
        self._closed = True
        if worker.thread.is_alive():
            worker.submit(_Job("close", lambda db: None, stop=True))
        await trio.to_thread.run_sync(worker.thread.join, join_seconds)
        if worker.thread.is_alive():
            logger.warning(
                "store %s: worker still busy %.1f s after close; queued writes may be lost",
                self.path,
                join_seconds,
            )

    async def _check(self) -> None:
        """PRAGMA quick_check, bounded in time; a damaged file is one line in the log."""
        try:
            self.damage = await self._run(
                f"check {self.path}", lambda db: quick_check(db.conn, QUICK_CHECK_SEC)
            )
        except StoreError as exc:
            logger.error("store %s: the start-up check failed: %s", self.path, exc)
            return
        said = check_summary(self.path, self.damage, QUICK_CHECK_SEC)
        if said is not None:
            (logger.warning if self.damage is None else logger.error)("store: %s", said)

    async def _run(self, op: str, fn: Callable[[Database], T], durable: bool = True) -> T:
        if self._worker is None:
            raise StoreError(
                f"{op}: the store at {self.path} is not open (use `async with"
                " SQLiteStore.open(path) as store`)"
            )
        if self._closed:
            raise StoreError(f"{op}: the store at {self.path} is closed")
        job: _Job[T] = _Job(op, fn, durable=durable)
        self._worker.submit(job)
        # Cancelled here? The job stays queued and still runs; only its answer is dropped.
        await job.done.wait()
        if job.error is not None:
            if isinstance(job.error, StoreError):
                raise job.error
            error = failure(op, self.path, job.error)
            if isinstance(error, StorageError):
                self._report(op, job.error, error)
            raise error from job.error
        # Back to normal: a write went through (unwritable), one that needed new room in
        # the file did (full; small writes may still fit while big ones do not).
        back = {"unwritable"} if job.wrote else set()
        back |= {"full"} if job.grew else set()
        if back & self._reported:
            logger.warning("store %s: writes succeed again", self.path)
            self._reported -= back
        return job.result  # type: ignore[return-value]  # set when error is None

    def _report(self, op: str, cause: BaseException, error: StorageError) -> None:
        """Log a storage failure once per condition (each request still gets its error)."""
        if isinstance(error, StorageFullError):
            key = "full"
        elif primary_code(cause) in _DAMAGED:
            key = f"damaged {op}"
        else:
            key = "unwritable"
        if key in self._reported:
            return
        self._reported.add(key)
        if key == "full":
            logger.error(
                "store %s: the disk is full (%s): every write fails with storage_full until "
                "space is freed (first: %s); reads go on", self.path, cause, op,
            )  # fmt: skip
        else:
            logger.error("store: %s", error)

    # -- sessions -------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        profile_id: str,
        title: str = "",
        user_id: str = "local",
        meta: dict[str, Any] | None = None,
    ) -> SessionRow:
        sid = _check_session_id(session_id) if session_id is not None else _new_session_id()
        now = self._now()
        row = SessionRow(
            id=sid,
            profile_id=_check_text(profile_id, "profile_id"),
            title=_check_text(title, "title", allow_empty=True),
            user_id=_check_text(user_id, "user_id"),
            created_at=now,
            updated_at=now,
            meta=dict(_check_meta(meta if meta is not None else {})),
        )
        meta_json = _dump(row.meta, "session meta")
        await self._run(f"create session {sid!r}", lambda db: _insert_session(db, row, meta_json))
        return row

    async def get_session(self, session_id: str) -> SessionRow | None:
        sid = _check_session_id(session_id)
        return await self._run(f"get session {sid!r}", lambda db: _get_session(db, sid))

    async def list_sessions(self, user_id: str | None = None) -> list[SessionRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run("list sessions", lambda db: _list_sessions(db, user_id))

    async def update_session(
        self,
        session_id: str,
        *,
        profile_id: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Change the given fields (meta is replaced whole) and bump updated_at."""
        sid = _check_session_id(session_id)
        changes: dict[str, Any] = {"updated_at": self._now()}
        if profile_id is not None:
            changes["profile_id"] = _check_text(profile_id, "profile_id")
        if title is not None:
            changes["title"] = _check_text(title, "title", allow_empty=True)
        if meta is not None:
            changes["meta"] = _dump(_check_meta(meta), "session meta")
        await self._run(f"update session {sid!r}", lambda db: _update_session(db, sid, changes))

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its history, context and kv rows keyed `sid` or `sid:…`."""
        sid = _check_session_id(session_id)
        return await self._run(f"delete session {sid!r}", lambda db: _delete_session(db, sid))

    # -- history --------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        *,
        messages: Sequence[dict[str, Any]] = (),
        context: Sequence[dict[str, Any]] = (),
        durable: bool = True,
        dequeue: str | None = None,
    ) -> None:
        """Append new display messages and context entries in one transaction.

        `durable=False`: committed without an fsync (see the module's "Durability").
        `dequeue`: the key of the queued message being appended; its queued row is
        deleted in the same transaction (it is never both queued and in history)."""
        sid = _check_session_id(session_id)
        msg_rows = _prepare(messages, "messages")
        # Both lists usually hold the same dicts: each is serialised once. (`messages` is
        # still referenced here, so the ids cannot be reused while this runs.)
        done = {id(m): row for m, row in zip(messages, msg_rows, strict=True)}
        ctx_rows = _prepare(context, "context", done)
        if not msg_rows and not ctx_rows and dequeue is None:
            return
        now = self._now()
        await self._run(
            f"append to session {sid!r}",
            lambda db: _append(db, sid, msg_rows, ctx_rows, now, dequeue),
            durable,
        )

    async def load_messages(self, session_id: str) -> list[dict[str, Any]]:
        sid = _check_session_id(session_id)
        return await self._run(
            f"load messages of {sid!r}", lambda db: _load_history(db, "messages", sid)
        )

    async def load_context(self, session_id: str) -> list[dict[str, Any]]:
        sid = _check_session_id(session_id)
        return await self._run(
            f"load context of {sid!r}", lambda db: _load_history(db, "context", sid)
        )

    async def replace_context(self, session_id: str, context: Sequence[dict[str, Any]]) -> None:
        """Compression only: swap the whole LLM context in one transaction."""
        sid = _check_session_id(session_id)
        rows = _prepare(context, "context")
        now = self._now()
        await self._run(
            f"replace context of {sid!r}", lambda db: _replace_context(db, sid, rows, now)
        )

    async def load_session(self, session_id: str) -> LoadedSession | None:
        """Row, messages and context, with dangling tool calls repaired and persisted.

        Call it when no run of this session is live: a run's in-flight tool calls look
        dangling until their results are appended.
        """
        sid = _check_session_id(session_id)
        now = self._now()
        return await self._run(f"load session {sid!r}", lambda db: _load_session(db, sid, now))

    # -- queued messages ---------------------------------------------------------------

    async def enqueue(
        self, session_id: str, key: str, message: dict[str, Any], *, pid: int, host: str
    ) -> None:
        """Keep a queued user message until its run appends it (`append(dequeue=key)`)."""
        sid = _check_session_id(session_id)
        _check_text(key, "queued message key")
        data = _dump(message, f"queued message of {sid!r}")
        now = self._now()
        await self._run(
            f"queue a message in {sid!r}", lambda db: _enqueue(db, sid, key, data, pid, host, now)
        )

    async def unqueue(self, key: str) -> bool:
        """Forget a queued message (dropped from a full queue). False when not there."""
        _check_text(key, "queued message key")
        return await self._run(f"unqueue message {key!r}", lambda db: _unqueue(db, key))

    async def adopt_queued(
        self, session_id: str, *, pid: int, host: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """(key, message) of the session's queued messages that no live process owns
        (theirs: same host, pid gone; or ours), in queued order, now owned by `pid`."""
        sid = _check_session_id(session_id)
        return await self._run(
            f"adopt queued messages of {sid!r}", lambda db: _adopt(db, sid, pid, host)
        )

    async def queued_sessions(self) -> list[str]:
        """Ids of the sessions with queued messages."""
        return await self._run("list sessions with queued messages", _queued_sessions)

    # -- kv -------------------------------------------------------------------------

    async def kv_get(self, scope: str, key: str) -> Any | None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        return await self._run(f"kv get {scope}/{key}", lambda db: _kv_get(db, scope, key))

    async def kv_set(self, scope: str, key: str, value: Any) -> None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        data = _dump(value, f"kv value for {scope}/{key}")
        now = self._now()
        await self._run(f"kv set {scope}/{key}", lambda db: _kv_set(db, scope, key, data, now))

    async def kv_delete(self, scope: str, key: str) -> None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        await self._run(f"kv delete {scope}/{key}", lambda db: _kv_delete(db, scope, key))

    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]:
        _check_text(scope, "kv scope")
        _check_text(prefix, "kv prefix", allow_empty=True)
        return await self._run(f"kv list {scope}/{prefix}*", lambda db: _kv_list(db, scope, prefix))

    # -- users ----------------------------------------------------------------------

    async def create_user(self, name: str, token: str, role: str = "user") -> dict[str, Any]:
        """Add a user; only a SHA-256 of the token is stored (tokens are random secrets)."""
        _check_text(name, "user name")
        _check_text(role, "user role")
        user = {
            "id": "u-" + uuid.uuid4().hex[:12],
            "name": name,
            "role": role,
            "created_at": self._now(),
        }
        digest = _token_digest(token)
        await self._run(f"create user {name!r}", lambda db: _insert_user(db, user, digest))
        return dict(user)

    async def get_user_by_token(self, token: str) -> dict[str, Any] | None:
        digest = _token_digest(token)
        return await self._run("find user by token", lambda db: _user_by_digest(db, digest))

    async def list_users(self) -> list[dict[str, Any]]:
        """Every user (id, name, role, created_at), oldest first; never a token."""
        return await self._run("list users", _list_users)

    async def get_user(self, user_id: str) -> dict[str, Any] | None:
        _check_text(user_id, "user id")
        return await self._run(f"get user {user_id}", lambda db: _user_where(db, "id", user_id))

    async def get_user_by_name(self, name: str) -> dict[str, Any] | None:
        _check_text(name, "user name")
        return await self._run(f"get user {name!r}", lambda db: _user_where(db, "name", name))

    async def remove_user(self, name: str) -> bool:
        """Remove the user called `name` (their sessions stay); False when unknown."""
        _check_text(name, "user name")
        return await self._run(f"remove user {name!r}", lambda db: _remove_user(db, name))

    async def rotate_user_token(self, name: str, token: str) -> bool:
        """Replace the token of `name`: the old one stops working. False when unknown."""
        _check_text(name, "user name")
        digest = _token_digest(token)
        return await self._run(
            f"rotate token of {name!r}", lambda db: _rotate_token(db, name, digest)
        )

    async def count_sessions(self, user_id: str) -> int:
        _check_text(user_id, "user id")
        return await self._run(f"count sessions of {user_id}", lambda db: _count(db, user_id))

    # -- leases ---------------------------------------------------------------------

    async def claim_lease(
        self, session_id: str, *, owner: str, pid: int, host: str, ttl: float
    ) -> LeaseRow:
        """Take the session's lease for `ttl` s unless a live owner holds it (see base)."""
        sid = _check_session_id(session_id)
        now = self._now()
        lease = LeaseRow(session_id=sid, owner=_check_text(owner, "lease owner"), pid=pid,
                         host=_check_text(host, "lease host"), expires_at=now + ttl)  # fmt: skip
        return await self._run(f"claim lease of {sid!r}", lambda db: _claim(db, lease, now))

    async def renew_lease(self, session_id: str, *, owner: str, ttl: float) -> bool:
        """Extend our lease by `ttl` s from now; False when it is no longer ours."""
        sid = _check_session_id(session_id)
        until = self._now() + ttl
        return await self._run(f"renew lease of {sid!r}", lambda db: _renew(db, sid, owner, until))

    async def release_lease(self, session_id: str, *, owner: str) -> None:
        sid = _check_session_id(session_id)
        await self._run(f"release lease of {sid!r}", lambda db: _release(db, sid, owner))

    # -- health ---------------------------------------------------------------------

    async def stats(self) -> dict[str, int]:
        """Row count per table."""
        return await self._run("stats", _stats)


def _new_session_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


def _token_digest(token: object) -> str:
    token = _check_text(token, "user token")
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


# -- on the worker thread: everything below touches the connection -------------------


def _get_session(db: Database, sid: str) -> SessionRow | None:
    row = db.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", [sid]).fetchone()
    return None if row is None else _session_from(row)


def _require_session(db: Database, sid: str) -> None:
    if db.execute("SELECT 1 FROM sessions WHERE id = ?", [sid]).fetchone() is None:
        raise StoreError(f"no session {sid!r} in the store")


def _insert_session(db: Database, row: SessionRow, meta_json: str) -> None:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM sessions WHERE id = ?", [row.id]).fetchone() is not None:
            raise StoreError(f"session {row.id!r} already exists")
        db.execute(
            f"INSERT INTO sessions ({_SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [row.id, row.profile_id, row.title, row.user_id, row.created_at, row.updated_at,
             meta_json],
        )  # fmt: skip


def _list_sessions(db: Database, user_id: str | None) -> list[SessionRow]:
    where, params = ("WHERE user_id = ?", [user_id]) if user_id is not None else ("", [])
    rows = db.execute(
        f"SELECT {_SESSION_COLS} FROM sessions {where} ORDER BY updated_at DESC, rowid DESC",
        params,
    ).fetchall()
    return [_session_from(r) for r in rows]


def _update_session(db: Database, sid: str, changes: dict[str, Any]) -> None:
    # Column names come from update_session's fixed keyword set, never from callers.
    sets = ", ".join(f"{col} = ?" for col in changes)
    with _write_tx(db):
        _require_session(db, sid)
        db.execute(f"UPDATE sessions SET {sets} WHERE id = ?", [*changes.values(), sid])


def _delete_session(db: Database, sid: str) -> bool:
    with _write_tx(db):
        for table in _HISTORY:
            db.execute(f"DELETE FROM {table} WHERE session_id = ?", [sid])
        db.execute("DELETE FROM queued WHERE session_id = ?", [sid])
        # substr, not LIKE: ids may contain LIKE's wildcard `_`.
        db.execute(
            "DELETE FROM kv WHERE key = ? OR substr(key, 1, ?) = ?", [sid, len(sid) + 1, sid + ":"]
        )
        return bool(db.execute("DELETE FROM sessions WHERE id = ?", [sid]).rowcount)


def _insert_history(
    db: Database, table: str, sid: str, rows: Sequence[_Row], positions: Sequence[float],
    now: float,
) -> None:  # fmt: skip
    db.conn.executemany(
        f"INSERT INTO {table} (session_id, position, role, content, is_plan, data, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(sid, pos, r.role, r.content, int(r.is_plan), r.data, now)
         for pos, r in zip(positions, rows, strict=True)],
    )  # fmt: skip


def _next_positions(db: Database, table: str, sid: str, count: int) -> list[float]:
    top = db.execute(
        f"SELECT COALESCE(MAX(position), 0) FROM {table} WHERE session_id = ?", [sid]
    ).fetchone()[0]
    return [float(top) + i for i in range(1, count + 1)]


def _append(
    db: Database, sid: str, msg_rows: list[_Row], ctx_rows: list[_Row], now: float,
    dequeue: str | None = None,
) -> None:  # fmt: skip
    with _write_tx(db):
        _require_session(db, sid)
        if dequeue is not None:
            _unqueue(db, dequeue)
        for table, rows in (("messages", msg_rows), ("context", ctx_rows)):
            if rows:
                positions = _next_positions(db, table, sid, len(rows))
                _insert_history(db, table, sid, rows, positions, now)
        db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", [now, sid])


def _load_history(db: Database, table: str, sid: str) -> list[dict[str, Any]]:
    _require_session(db, sid)
    rows = db.execute(
        f"SELECT data FROM {table} WHERE session_id = ? ORDER BY position", [sid]
    ).fetchall()
    return [loads_clean(r[0]) for r in rows]  # an older version stored lone surrogates


def _replace_context(db: Database, sid: str, rows: list[_Row], now: float) -> None:
    with _write_tx(db):
        _require_session(db, sid)
        db.execute("DELETE FROM context WHERE session_id = ?", [sid])
        _insert_history(db, "context", sid, rows, [float(i) for i in range(1, len(rows) + 1)], now)


def _placeholder_positions(
    original: Sequence[float], inserted: Sequence[tuple[int, dict[str, Any]]]
) -> list[float]:
    """Positions strictly between the original neighbours of each run of placeholders."""
    indexes = [i for i, _ in inserted]
    out: list[float] = []
    start = 0
    while start < len(indexes):
        end = start
        while end + 1 < len(indexes) and indexes[end + 1] == indexes[end] + 1:
            end += 1
        before = indexes[start] - start  # originals preceding this run (>= 1: the assistant)
        low = original[before - 1]
        high = original[before] if before < len(original) else low + 1.0
        count = end - start + 1
        out.extend(low + (high - low) * (k + 1) / (count + 1) for k in range(count))
        start = end + 1
    return out


def _load_session(db: Database, sid: str, now: float) -> LoadedSession | None:
    row = _get_session(db, sid)
    if row is None:
        return None
    loaded: dict[str, list[dict[str, Any]]] = {}
    repaired = 0
    # One job on the one thread: no append can slip between reading and repairing.
    with _write_tx(db):
        for table in _HISTORY:
            records = db.execute(
                f"SELECT position, data FROM {table} WHERE session_id = ? ORDER BY position",
                [sid],
            ).fetchall()
            items = [loads_clean(r[1]) for r in records]  # lone surrogates: U+FFFD
            fixed, inserted = repair_dangling_tool_calls(items)
            if inserted:
                positions = _placeholder_positions([r[0] for r in records], inserted)
                rows = _prepare([ph for _, ph in inserted], f"{table} placeholders")
                _insert_history(db, table, sid, rows, positions, now)
            loaded[table] = fixed
            repaired += len(inserted)
    return LoadedSession(
        row=row, messages=loaded["messages"], context=loaded["context"], repaired=repaired
    )


def _kv_get(db: Database, scope: str, key: str) -> Any | None:
    row = db.execute("SELECT value FROM kv WHERE scope = ? AND key = ?", [scope, key]).fetchone()
    return None if row is None else json.loads(row[0])


def _kv_set(db: Database, scope: str, key: str, value: str, now: float) -> None:
    with _write_tx(db):
        db.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            [scope, key, value, now],
        )


def _kv_delete(db: Database, scope: str, key: str) -> None:
    with _write_tx(db):
        db.execute("DELETE FROM kv WHERE scope = ? AND key = ?", [scope, key])


def _kv_list(db: Database, scope: str, prefix: str) -> list[tuple[str, Any]]:
    rows = db.execute(
        "SELECT key, value FROM kv WHERE scope = ? AND substr(key, 1, ?) = ? ORDER BY key",
        [scope, len(prefix), prefix],
    ).fetchall()
    return [(r[0], json.loads(r[1])) for r in rows]


def _insert_user(db: Database, user: dict[str, Any], digest: str) -> None:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM users WHERE token_sha256 = ?", [digest]).fetchone():
            raise StoreError("a user with this token already exists; tokens must be unique")
        db.execute(
            "INSERT INTO users (id, name, token_sha256, role, created_at) VALUES (?, ?, ?, ?, ?)",
            [user["id"], user["name"], digest, user["role"], user["created_at"]],
        )


def _user_by_digest(db: Database, digest: str) -> dict[str, Any] | None:
    row = db.execute(
        "SELECT id, name, role, created_at FROM users WHERE token_sha256 = ?", [digest]
    ).fetchone()
    if row is None:
        return None
    return {"id": row[0], "name": row[1], "role": row[2], "created_at": row[3]}


_USER_COLS = "id, name, role, created_at"


def _user_dict(row: Sequence[Any]) -> dict[str, Any]:
    return {"id": row[0], "name": row[1], "role": row[2], "created_at": row[3]}


def _list_users(db: Database) -> list[dict[str, Any]]:
    rows = db.execute(f"SELECT {_USER_COLS} FROM users ORDER BY created_at, rowid").fetchall()
    return [_user_dict(r) for r in rows]


def _user_where(db: Database, column: str, value: str) -> dict[str, Any] | None:
    # `column` is one of two literals from the callers above, never user input.
    row = db.execute(f"SELECT {_USER_COLS} FROM users WHERE {column} = ?", [value]).fetchone()
    return None if row is None else _user_dict(row)


def _count(db: Database, user_id: str) -> int:
    row = db.execute("SELECT COUNT(*) FROM sessions WHERE user_id = ?", [user_id]).fetchone()
    return int(row[0])


def _remove_user(db: Database, name: str) -> bool:
    return bool(db.execute("DELETE FROM users WHERE name = ?", [name]).rowcount)


def _rotate_token(db: Database, name: str, digest: str) -> bool:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM users WHERE token_sha256 = ?", [digest]).fetchone():
            raise StoreError("a user with this token already exists; tokens must be unique")
        return bool(
            db.execute("UPDATE users SET token_sha256 = ? WHERE name = ?", [digest, name]).rowcount
        )


def read_only_stats(path: Path) -> dict[str, int]:
    """Row count per table of an existing database, opened read-only (blocking).

    For `navi doctor`, which must not create or change anything: no WAL switch, no
    schema, no parent folders. StoreError when the file is not a navi database.
    """
    conn = _connect_read_only(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path} has schema version {version}; this navi knows {SCHEMA_VERSION}"
            )
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = [t for t in _TABLES if t not in names]
        if missing:
            raise StoreError(f"{path} is not a navi database (no table {', '.join(missing)})")
        return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _TABLES}
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read {path}: {exc}") from None
    finally:
        conn.close()


def read_only_check(path: Path, seconds: float = QUICK_CHECK_SEC) -> dict[str, Any]:
    """`navi doctor`'s PRAGMA quick_check of an existing database (blocking, bounded in
    time, read-only): ``ok`` (no damage found), ``done`` (the check finished),
    ``problems`` and ``summary`` (the one line saying what is wrong, None when ok)."""
    try:
        conn = _connect_read_only(path)
    except StoreError as exc:
        return {"ok": False, "done": False, "problems": [], "summary": str(exc)}
    try:
        problems = quick_check(conn, seconds)
    except sqlite3.Error as exc:
        said = f"the database {path} could not be checked: {exc}"
        return {"ok": False, "done": False, "problems": [], "summary": said}
    finally:
        conn.close()
    return {
        "ok": not problems, "done": problems is not None, "problems": problems or [],
        "summary": check_summary(path, problems, seconds),
    }  # fmt: skip


def _connect_read_only(path: Path) -> sqlite3.Connection:
    # Read-only still creates the -wal and -shm files of a WAL database when they are
    # absent (the last close checkpointed and removed them). Then the main file holds
    # everything, and "immutable" reads it without creating anything.
    wal = path.with_name(path.name + "-wal")
    mode = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    uri = f"file:{urllib.parse.quote(str(path))}?{mode}"
    try:
        return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {path} read-only: {exc}") from None


def _stats(db: Database) -> dict[str, int]:
    return {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _TABLES}
