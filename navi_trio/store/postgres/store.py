"""The PostgreSQL session store: the `SessionStore` protocol for several daemons.

    async with PostgresStore.open("postgresql://navi@db.example/navi") as store:
        row = await store.create_session(profile_id="default")
        await store.append(row.id, messages=[msg], context=[msg])

The same contract as the SQLite store (store/base.py), on a server that several daemons
share: append-only saves, `append(dequeue=key)` in the transaction that takes the
message off the queue, `durable=False` as ``synchronous_commit = off`` for that one
transaction, dangling tool calls repaired and persisted on load, leases taken over
when expired or their process is gone, and every failure a StoreError naming the
operation (`_errors`: a full disk `StorageFullError`, an unreachable, read-only or
damaged server `StorageError`).

How it runs: psycopg 3 with a psycopg_pool pool of at most `pool_size` connections, and
as many worker threads (`_workers`: why not one thread per call); trio never blocks.
Opening connects (within `OPEN_WAIT_S`) and applies the schema's migrations under an
advisory lock (`_migrate`). Leaving `open()` lets the threads finish every queued job,
then closes the pool, shielded and bounded by `close_timeout` seconds of real time.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import psycopg
import psycopg_pool
import trio
from psycopg.conninfo import conninfo_to_dict

from navi_trio.errors import StorageError, StoreError
from navi_trio.store._control_input import (
    check_amounts,
    check_keys,
    check_limit,
    new_session_row,
    queued_values,
    schedule_values,
)
from navi_trio.store._input import (
    _check_meta,
    _check_text,
    _dump,
    _prepare,
    _prepare_rewrite,
    check_session_id,
)
from navi_trio.store._sessions import _new_session_id
from navi_trio.store._users import _token_digest
from navi_trio.store.base import (
    LeaseRow,
    LoadedSession,
    NewSession,
    QueuedRow,
    ScheduleRow,
    SessionRow,
)
from navi_trio.store.db_url import describe
from navi_trio.store.fence import fence_for
from navi_trio.store.postgres import _control as ctl
from navi_trio.store.postgres import _history as h
from navi_trio.store.postgres import _tables as t
from navi_trio.store.postgres._bus import PgBus
from navi_trio.store.postgres._errors import failure
from navi_trio.store.postgres._migrate import migrate
from navi_trio.store.postgres._workers import POOL_WAIT_S, Conn, Job, Workers, configure

logger = logging.getLogger(__name__)
T = TypeVar("T")
POOL_SIZE = 8  # connections (and worker threads) per store
OPEN_WAIT_S = 10.0  # opening waits this long for the first connection
CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout, unless the URL sets one


def check_url(url: str) -> str:
    """`url` when libpq can use it; StoreError naming the problem (never the password)."""
    try:
        conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise StoreError(f"{describe(url)} is not a usable PostgreSQL URL ({exc})") from None
    return url


class PostgresStore:
    """The session store on a PostgreSQL database. Create it with `PostgresStore.open(url)`."""

    def __init__(self, url: str, *, pool_size: int = POOL_SIZE) -> None:
        self.where = describe(url)  # never the password
        self._url = check_url(url)
        if pool_size < 1:
            raise StoreError(f"pool_size must be 1 or more, got {pool_size!r}")
        self._pool_size = pool_size
        self._workers: Workers | None = None
        self._closed = False
        self._last_now = 0.0
        # Conditions already logged ("full", "unwritable", "unreachable"): one line when
        # one starts, one when a call succeeds again (`_run`).
        self._reported: set[str] = set()

    def _now(self) -> float:
        # Strictly increasing, so "newest updated first" never depends on clock resolution.
        self._last_now = max(time.time(), self._last_now + 1e-6)
        return self._last_now

    @classmethod
    def open(
        cls, url: str, *, pool_size: int = POOL_SIZE, close_timeout: float = 10.0
    ) -> AbstractAsyncContextManager[PostgresStore]:
        """Connect, migrate the schema, and close on exit (see the module's docstring)."""
        return cls._open(url, pool_size, close_timeout)

    @classmethod
    @asynccontextmanager
    async def _open(
        cls, url: str, pool_size: int, close_timeout: float
    ) -> AsyncIterator[PostgresStore]:
        store = cls(url, pool_size=pool_size)
        pool = store._make_pool()
        try:
            try:
                await trio.to_thread.run_sync(
                    functools.partial(pool.open, wait=True, timeout=OPEN_WAIT_S)
                )
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                raise failure(f"open store {store.where}", store.where, exc)[0] from exc
            workers = Workers(pool, pool_size, store.where)
            workers.start()
            store._workers = workers
            try:
                migrated = await store._run(
                    f"migrate the schema of {store.where}",
                    lambda conn: migrate(conn, store.where),
                    transaction=False,
                )
                if migrated:
                    logger.info("store %s: applied migration(s) %s", store.where, migrated)
                yield store
            finally:
                with trio.CancelScope(shield=True):
                    await store._stop(close_timeout)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(pool.close, close_timeout)

    def _make_pool(self) -> psycopg_pool.ConnectionPool[Conn]:
        given = conninfo_to_dict(self._url)
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in given:
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in given:
            kwargs["application_name"] = "navi"
        return psycopg_pool.ConnectionPool(
            self._url, min_size=1, max_size=self._pool_size, open=False, kwargs=kwargs,
            configure=configure, check=psycopg_pool.ConnectionPool.check_connection,
            timeout=POOL_WAIT_S, name=f"navi {self.where}",
        )  # fmt: skip

    async def _stop(self, seconds: float) -> None:
        workers = self._workers
        if workers is None or self._closed:
            return
        self._closed = True
        workers.stop()
        if not await trio.to_thread.run_sync(workers.join, seconds):
            logger.warning(
                "store %s: workers still busy %.1f s after close; queued writes may be lost",
                self.where, seconds,
            )  # fmt: skip

    async def _run(
        self, op: str, fn: Callable[[Conn], T], *, durable: bool = True, write: bool = True,
        transaction: bool = True,
    ) -> T:  # fmt: skip
        if self._workers is None:
            raise StoreError(
                f"{op}: the store at {self.where} is not open (use `async with"
                " PostgresStore.open(url) as store`)"
            )
        if self._closed:
            raise StoreError(f"{op}: the store at {self.where} is closed")
        job: Job[T] = Job(op, fn, durable=durable, transaction=transaction)
        self._workers.submit(job)
        # Cancelled here? The job stays queued and still runs; only its answer is dropped.
        await job.done.wait()
        if job.error is not None:
            error, said = failure(op, self.where, job.error)
            if said is not None:
                self._report(said, error)
            if error is job.error:
                raise error
            raise error from job.error
        # Back to normal: any answer ends "unreachable"; a write ends "full" / "unwritable".
        back = self._reported if write else self._reported & {"unreachable"}
        if back:
            logger.warning("store %s: %s again", self.where, "writes succeed" if write else
                           "the database answers")  # fmt: skip
            self._reported -= back
        return job.result  # type: ignore[return-value]  # set when error is None

    async def run_raw_for_tests(
        self, op: str, fn: Callable[[Conn], T], *, durable: bool = True
    ) -> T:
        """For tests and diagnostics only: `fn(conn)` on one of the store's connections.

        One job on the worker threads, in a transaction, as every method's (the same
        error mapping, `durable=False` as an append's). Nothing in navi_trio calls it;
        the SQLite store has the same hook, with its sqlite-utils Database.
        """
        return await self._run(op, fn, durable=durable)

    def _report(self, said: str, error: StorageError | StoreError) -> None:
        """Log a storage failure once per condition (each request still gets its error)."""
        if said in self._reported:
            return
        self._reported.add(said)
        logger.error("store: %s (logged once until the database answers again)", error)

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
        sid = check_session_id(session_id) if session_id is not None else _new_session_id()
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
        await self._run(f"create session {sid!r}", lambda c: h.insert_session(c, row, meta_json))
        return row

    async def get_session(self, session_id: str) -> SessionRow | None:
        sid = check_session_id(session_id)
        return await self._run(f"get session {sid!r}", lambda c: h.get_session(c, sid), write=False)

    async def list_sessions(self, user_id: str | None = None) -> list[SessionRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run("list sessions", lambda c: h.list_sessions(c, user_id), write=False)

    async def update_session(
        self,
        session_id: str,
        *,
        profile_id: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Change the given fields (meta is replaced whole) and bump updated_at."""
        sid = check_session_id(session_id)
        changes: dict[str, Any] = {"updated_at": self._now()}
        if profile_id is not None:
            changes["profile_id"] = _check_text(profile_id, "profile_id")
        if title is not None:
            changes["title"] = _check_text(title, "title", allow_empty=True)
        if meta is not None:
            changes["meta"] = _dump(_check_meta(meta), "session meta")
        fence = fence_for(sid)
        await self._run(
            f"update session {sid!r}",
            h.fenced(fence, lambda c: h.update_session(c, sid, changes, fence)),
        )

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its history, context, queue and kv rows `sid` or `sid:…`."""
        sid = check_session_id(session_id)
        return await self._run(f"delete session {sid!r}", lambda c: h.delete_session(c, sid))

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
        """Append new display messages and context entries in one transaction (base)."""
        sid = check_session_id(session_id)
        msg_rows = _prepare(messages, "messages")
        done = {id(m): row for m, row in zip(messages, msg_rows, strict=True)}
        ctx_rows = _prepare(context, "context", done)
        if not msg_rows and not ctx_rows and dequeue is None:
            return
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"append to session {sid!r}",
            h.fenced(fence, lambda c: h.append(c, sid, msg_rows, ctx_rows, now, dequeue, fence)),
            durable=durable,
        )

    async def load_messages(self, session_id: str) -> list[dict[str, Any]]:
        sid = check_session_id(session_id)
        return await self._run(
            f"load messages of {sid!r}", lambda c: h.load_history(c, "messages", sid), write=False
        )

    async def load_context(self, session_id: str) -> list[dict[str, Any]]:
        sid = check_session_id(session_id)
        return await self._run(
            f"load context of {sid!r}", lambda c: h.load_history(c, "context", sid), write=False
        )

    async def replace_context(self, session_id: str, context: Sequence[dict[str, Any]]) -> None:
        """Compression only: swap the whole LLM context in one transaction."""
        sid = check_session_id(session_id)
        rows = _prepare(context, "context")
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"replace context of {sid!r}",
            h.fenced(fence, lambda c: h.replace_context(c, sid, rows, now, fence)),
        )

    async def rewrite_history(
        self,
        session_id: str,
        *,
        keep: int,
        messages: Sequence[dict[str, Any]] = (),
        context: Sequence[dict[str, Any]],
        kv_set: Sequence[tuple[str, str, Any]] = (),
        kv_delete: Sequence[tuple[str, str]] = (),
    ) -> None:
        """A rewind or a branch brought back, in one transaction (base)."""
        sid = check_session_id(session_id)
        job = _prepare_rewrite(keep, messages, context, kv_set, kv_delete)
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"rewrite history of {sid!r}",
            h.fenced(fence, lambda c: h.rewrite(c, sid, job, now, fence)),
        )

    async def load_session(self, session_id: str) -> LoadedSession | None:
        """Row, messages and context, dangling tool calls repaired and persisted (base)."""
        sid = check_session_id(session_id)
        now = self._now()
        fence = fence_for(sid)
        return await self._run(
            f"load session {sid!r}",
            h.fenced(fence, lambda c: h.load_session(c, sid, now, fence)),
            write=False,
        )

    # -- queued messages ---------------------------------------------------------------

    async def enqueue(
        self, session_id: str, key: str, message: dict[str, Any], *, pid: int, host: str
    ) -> None:
        """Keep a queued user message until its run appends it (`append(dequeue=key)`)."""
        sid = check_session_id(session_id)
        _check_text(key, "queued message key")
        data = _dump(message, f"queued message of {sid!r}")
        now = self._now()
        await self._run(
            f"queue a message in {sid!r}", lambda c: t.enqueue(c, sid, key, data, pid, host, now)
        )

    async def unqueue(self, key: str) -> bool:
        """Forget a queued message (dropped from a full queue). False when not there."""
        _check_text(key, "queued message key")
        return await self._run(f"unqueue message {key!r}", lambda c: t.unqueue(c, key))

    async def adopt_queued(
        self, session_id: str, *, pid: int, host: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """(key, message) of the session's queued messages that no live process owns
        (theirs: same host, pid gone; or ours), in queued order, now owned by `pid`."""
        sid = check_session_id(session_id)
        return await self._run(
            f"adopt queued messages of {sid!r}", lambda c: t.adopt(c, sid, pid, host)
        )

    async def queued_sessions(self) -> list[str]:
        """Ids of the sessions with queued messages."""
        return await self._run("list sessions with queued messages", t.queued_sessions, write=False)

    # -- kv -------------------------------------------------------------------------

    async def kv_get(self, scope: str, key: str) -> Any | None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        return await self._run(
            f"kv get {scope}/{key}", lambda c: t.kv_get(c, scope, key), write=False
        )

    async def kv_set(self, scope: str, key: str, value: Any) -> None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        data = _dump(value, f"kv value for {scope}/{key}")
        now = self._now()
        await self._run(f"kv set {scope}/{key}", lambda c: t.kv_set(c, scope, key, data, now))

    async def kv_delete(self, scope: str, key: str) -> None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        await self._run(f"kv delete {scope}/{key}", lambda c: t.kv_delete(c, scope, key))

    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]:
        _check_text(scope, "kv scope")
        _check_text(prefix, "kv prefix", allow_empty=True)
        return await self._run(
            f"kv list {scope}/{prefix}*", lambda c: t.kv_list(c, scope, prefix), write=False
        )

    # -- users ----------------------------------------------------------------------

    async def create_user(self, name: str, token: str, role: str = "user") -> dict[str, Any]:
        """Add a user; only a SHA-256 of the token is stored (tokens are random secrets)."""
        _check_text(name, "user name")
        _check_text(role, "user role")
        user = {"id": "u-" + uuid.uuid4().hex[:12], "name": name, "role": role,
                "created_at": self._now()}  # fmt: skip
        digest = _token_digest(token)
        await self._run(f"create user {name!r}", lambda c: t.insert_user(c, user, digest))
        return dict(user)

    async def get_user_by_token(self, token: str) -> dict[str, Any] | None:
        digest = _token_digest(token)
        return await self._run(
            "find user by token", lambda c: t.user_by_digest(c, digest), write=False
        )

    async def list_users(self) -> list[dict[str, Any]]:
        """Every user (id, name, role, created_at), oldest first; never a token."""
        return await self._run("list users", t.list_users, write=False)

    async def get_user(self, user_id: str) -> dict[str, Any] | None:
        _check_text(user_id, "user id")
        return await self._run(
            f"get user {user_id}", lambda c: t.user_by_id(c, user_id), write=False
        )

    async def get_user_by_name(self, name: str) -> dict[str, Any] | None:
        _check_text(name, "user name")
        return await self._run(f"get user {name!r}", lambda c: t.user_by_name(c, name), write=False)

    async def remove_user(self, name: str) -> bool:
        """Remove the user called `name` (their sessions stay); False when unknown."""
        _check_text(name, "user name")
        return await self._run(f"remove user {name!r}", lambda c: t.remove_user(c, name))

    async def rotate_user_token(self, name: str, token: str) -> bool:
        """Replace the token of `name`: the old one stops working. False when unknown."""
        _check_text(name, "user name")
        digest = _token_digest(token)
        return await self._run(
            f"rotate token of {name!r}", lambda c: t.rotate_token(c, name, digest)
        )

    async def count_sessions(self, user_id: str) -> int:
        _check_text(user_id, "user id")
        return await self._run(
            f"count sessions of {user_id}", lambda c: t.count_sessions(c, user_id), write=False
        )

    # -- leases ---------------------------------------------------------------------

    async def claim_lease(
        self, session_id: str, *, owner: str, pid: int, host: str, ttl: float
    ) -> LeaseRow:
        """Take the session's lease for `ttl` s unless a live owner holds it (see base)."""
        sid = check_session_id(session_id)
        _check_text(owner, "lease owner")
        _check_text(host, "lease host")
        return await self._run(
            f"claim lease of {sid!r}", lambda c: t.claim_lease(c, sid, owner, pid, host, ttl)
        )

    async def renew_lease(self, session_id: str, *, owner: str, ttl: float) -> bool:
        """Extend our lease by `ttl` s from now; False when it is no longer ours."""
        sid = check_session_id(session_id)
        return await self._run(
            f"renew lease of {sid!r}", lambda c: t.renew_lease(c, sid, owner, ttl)
        )

    async def release_lease(self, session_id: str, *, owner: str) -> None:
        sid = check_session_id(session_id)
        await self._run(f"release lease of {sid!r}", lambda c: t.release_lease(c, sid, owner))

    # -- several daemons -------------------------------------------------------------

    def bus(self) -> PgBus:
        """LISTEN / NOTIFY between the daemons of this database (core/cluster.py)."""
        return PgBus(self, self._url)

    # -- wake-ups, usage, schedules (store/_control.py says what each does) ----------

    async def enqueue_wake(
        self,
        wake: QueuedRow,
        *,
        note: tuple[str, str, Any] | None,
        limit: int,
        per: float,
    ) -> bool:
        values = queued_values(wake, "wake-up")
        check_limit(limit, per)
        kv = None
        if note is not None:
            scope, key, value = note
            kv = (_check_text(scope, "kv scope"), _check_text(key, "kv key"),
                  _dump(value, f"kv value for {scope}/{key}"))  # fmt: skip
        now = self._now()
        return await self._run(
            f"queue a wake-up of {wake.session_id!r}",
            lambda c: ctl.enqueue_wake(c, values, kv, limit, now - per, now),
        )

    async def add_usage(self, keys: Sequence[str], amounts: dict[str, float]) -> None:
        names = check_keys(keys)
        adds = check_amounts(amounts)
        if not names or not any(adds.values()):
            return
        now = self._now()
        await self._run("add usage", lambda c: ctl.add_usage(c, names, adds, now))

    async def get_usage(self, keys: Sequence[str]) -> dict[str, dict[str, float]]:
        names = check_keys(keys)
        if not names:
            return {}
        return await self._run("read usage", lambda c: ctl.get_usage(c, names), write=False)

    async def create_schedule(self, row: ScheduleRow) -> ScheduleRow:
        values = schedule_values(row)
        return await self._run(
            f"create schedule {row.id!r}", lambda c: ctl.create_schedule(c, values, row)
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRow | None:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"get schedule {sid!r}", lambda c: ctl.get_schedule(c, sid), write=False
        )

    async def list_schedules(self, user_id: str | None = None) -> list[ScheduleRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run(
            "list schedules", lambda c: ctl.list_schedules(c, user_id), write=False
        )

    async def count_schedules(self, user_id: str) -> int:
        _check_text(user_id, "user_id")
        return await self._run(
            f"count schedules of {user_id}", lambda c: ctl.count_schedules(c, user_id),
            write=False,
        )  # fmt: skip

    async def set_schedule(self, schedule_id: str, *, paused: bool, next_due: float | None) -> bool:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"update schedule {sid!r}", lambda c: ctl.set_schedule(c, sid, bool(paused), next_due)
        )

    async def delete_schedule(self, schedule_id: str) -> bool:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(f"delete schedule {sid!r}", lambda c: ctl.delete_schedule(c, sid))

    async def claim_schedule(
        self,
        schedule_id: str,
        *,
        due: float,
        next_due: float | None,
        run: QueuedRow | None,
        session: NewSession | None = None,
    ) -> bool:
        sid = _check_text(schedule_id, "schedule id")
        values = None if run is None else queued_values(run, "scheduled run")
        new = None if session is None else new_session_row(session)
        now = self._now()
        return await self._run(
            f"claim schedule {sid!r}",
            lambda c: ctl.claim(c, sid, float(due), next_due, values, new, now),
        )

    # -- health ---------------------------------------------------------------------

    async def stats(self) -> dict[str, int]:
        """Row count per table."""
        return await self._run("stats", t.stats, write=False)
