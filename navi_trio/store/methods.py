"""`SessionStore`: the session store's methods, written once for both engines (SQLite and
PostgreSQL), and the contract they keep. Everything above the store layer uses this class.

Every method is the same three steps on either engine: check and serialise the input on
the caller's side (`_input`, `_control_input`: a bad argument fails before any job is
queued, and the worker gets a snapshot the caller cannot change), name the operation
(the label every `StoreError` carries), and run one statement function on the engine's
worker threads (`_run`).
A write to a session made inside a `fenced` block carries that fence (store/fence.py).

What an engine brings: its statements (`sql`, an `Engine` of store/statements.py:
those both engines share, over its placeholder and write transaction, and its own
where the SQL differs), each run on a worker thread with the engine's connection, and
`_run` (its thread runner and its error mapping).

The contract both engines keep (tests/test_store_contract*.py hold them to it):
- Messages are plain JSON-able dicts (the internal shape of `navi_trio.llm.base` plus
  display keys such as ``is_plan``); ``load_*`` returns exactly what was appended.
- A save appends what is new. Only `replace_context` (compression) and
  `rewrite_history` (a rewind, a branch brought back) rewrite anything; a rewrite is one
  transaction: a crash leaves the history, the context and its kv rows before or after.
- `append(dequeue=key)` takes that queued message off the queue in the same
  transaction, compare and set: when its row is no longer there (another daemon took
  it first, the cap dropped it) the append raises `NotQueuedError` and stores nothing.
  A queued message is in the queue or in the history at every commit, never both,
  never neither, and is appended at most once.
- `enqueue(keep=N)` holds the session's queue to its newest N rows in the insert's
  transaction and returns the rows it dropped, oldest first; `release_queued` hands a
  process's rows to whoever runs the session (pid `HANDED_PID`: anyone's), and
  `adopt_queued` takes those, a dead process's and the caller's own.
- `append(claim=…)` and `enqueue(claim=…)` take a client's message key (`KeyClaim`) in
  the transaction that stores the message: a key of the session that another message
  took already raises `DuplicateMessageError` and stores nothing (the same message
  claiming it again, a retried save, passes). `message_key` reads what the taker's
  ``ok`` said. The session keeps its newest `KEYS_KEPT` keys (older ones go with the
  next claim) and loses them with itself.
- `durable=False` (`append`, `create_session`, `update_session`, `kv_set`) may skip the
  flush to stable storage, never the commit: the write survives a killed process; the
  next durable write makes it survive power loss too.
- `load_session` pairs every dangling assistant tool call with a placeholder result
  (`repair_dangling_tool_calls`) and persists the placeholders, so it is idempotent.
- `claim_lease` returns the lease's holder after the attempt: the claimer's own row
  when it won; the live holder's when not. A claim takes over an expired lease, and
  a lease whose process (same host) is gone. A takeover by another owner bumps the
  lease's `generation`; a release expires the row but keeps it (generations never go
  back). `append`, `replace_context`, `update_session` and `load_session`'s repair,
  made inside `store.fence.fenced(...)`, are refused with `LeaseLostError` (nothing
  stored) unless the lease row still names that owner and generation: a paused owner
  that another daemon replaced cannot write to the session any more. `kv_set` and
  `kv_delete` made inside any `fenced` block carry its fence the same way, whatever
  their key. `renew_lease(generation=G)` renews only while the row still holds G.
- `append(owes_end=True)`, fenced, marks the lease as owing the session a turn's end
  (`end_owed`) in the transaction that stores the turn's start (with nothing to append
  too: a turn run again on a message stored already owes its end); what clears it is the
  release, and on PostgreSQL the commit that sends that turn's ``stream_end`` to the
  other daemons (`ClusterBus.notify`'s `ended`). A claim and a takeover keep it: a dead
  owner's debt passes to whoever takes its lease over.
- `enqueue_wake` stores a background job's note and, unless the session was woken
  `limit` times in the last `per` seconds, a queued wake-up and its count, in one
  transaction: the note and its wake-up land together or not at all.
- `add_usage` adds to counters under keys (a session's, a user's day's) in one
  transaction; several daemons adding at once never lose an increment.
- `reserve_usage` checks and takes in one transaction, counting what other runs hold:
  for each key, its counters plus its live holds (not expired; on this host, not of a
  dead process) stay within its limits, or nothing is taken and the reply names the
  key and kind that refused. What it grants is spent at once (no `hold`) or held under
  the hold's id until `settle_usage` adds what was really used and drops the hold,
  in one transaction; a hold nobody settles stops counting when it expires.
- `create_session(sessions_max=n)` and `claim_schedule(sessions_max=n)` count the
  user's sessions in the transaction that creates one: at most `n`, across daemons.
- `claim_schedule` moves a schedule from the due time it was read at to the next one
  only if nobody moved it meanwhile (compare and set), and in the same transaction
  creates the run's session when asked and queues its message: a due time is claimed
  once, by one daemon, and its run survives a crash as a queued message.
- `remove_user` removes the user's schedules and queued messages in the same
  transaction (their sessions stay). Every committed change of the users table (add,
  remove, rotate) is signalled to the daemons on the database: PostgreSQL notifies
  ``navi_users`` with the commit; SQLite rewrites its users marker after it
  (store/_users_signal.py, watched by `SQLiteStore.watch_users`).
- Failures raise `navi_trio.errors.StoreError` naming the operation (and the session);
  when the file itself is the problem, its subclasses say which: `StorageFullError`
  (the disk is full) or `StorageError` (read-only, an I/O error, damaged). Nothing of
  a failed operation is stored.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import trio

from navi_trio.errors import LimitError, StoreError
from navi_trio.store._control_input import (
    check_adds,
    check_amounts,
    check_keys,
    check_limit,
    check_release,
    check_reserve,
    check_sessions_max,
    new_session_row,
    queued_values,
    schedule_values,
    sessions_full,
)
from navi_trio.store._input import (
    _check_meta,
    _check_text,
    _dump,
    _prepare,
    _prepare_rewrite,
    check_keep,
    check_page,
    check_session_id,
    token_digest,
)
from navi_trio.store.base import (
    RUN_KINDS,
    USAGE_GROUPS,
    Claimed,
    HistoryPage,
    KeyClaim,
    LeaseRow,
    LoadedSession,
    NewSession,
    QueuedRow,
    RunUsage,
    ScheduleRow,
    SessionRow,
    UsageAsk,
    UsageGrant,
    UsageLine,
    UsageRequest,
)
from navi_trio.store.fence import Fence, current_fence, fence_for
from navi_trio.store.statements import Engine, Queued

T = TypeVar("T")


class SessionStore:
    """Sessions, their display history and LLM context, kv values, users, leases, the queue,
    usage and schedules: the methods over an engine's statements (`sql`) and its `_run`."""

    sql: ClassVar[Engine]  # the engine's statements
    _last_now = 0.0
    _wall: Callable[[], float] = staticmethod(time.time)  # the clock of `_now`
    # Told how long each write took, from its call to its commit (the daemon's metrics).
    _on_write: Callable[[float], None] | None = None

    def observe_writes(self, seconds: Callable[[float], None] | None) -> None:
        """Have `seconds` told each write's time from its call to its commit."""
        self._on_write = seconds

    def _wrote(self, started: float) -> None:
        if self._on_write is not None:
            self._on_write(trio.current_time() - started)

    def use_clock(self, wall: Callable[[], float]) -> None:
        """Stamp rows and judge leases by `wall` (seconds since the epoch) from now on:
        the daemon's one wall clock, which a test puts on trio's virtual time."""
        self._wall = wall

    def _now(self) -> float:
        # Strictly increasing, so "newest updated first" never depends on clock resolution.
        self._last_now = max(self._wall(), self._last_now + 1e-6)
        return self._last_now

    async def _run(
        self,
        op: str,
        fn: Callable[[Any], T],
        *,
        durable: bool = True,
        write: bool = True,
        transaction: bool = True,
    ) -> T:
        """Run `fn(conn)` as one job on the engine's workers: its answer, or a StoreError
        naming `op`. `durable=False`: commit without waiting for the disk; `write=False`:
        a read (an engine may use it for its health reports); `transaction=False`: `fn` is
        one statement, its own transaction."""
        raise NotImplementedError

    async def stats(self) -> dict[str, int]:
        """Row count per table (the engine's own statement)."""
        raise NotImplementedError

    async def run_raw_for_tests(
        self, op: str, fn: Callable[[Any], T], *, durable: bool = True
    ) -> T:
        """For tests and diagnostics only: `fn(conn)` as one job on the store's workers,
        as every method's (in order with them, the same error mapping, `durable=False`
        as an append's); `conn` is the engine's own (a sqlite3 connection, or a psycopg
        connection in a transaction). Nothing in navi_trio calls it."""
        return await self._run(op, fn, durable=durable)

    def _fenced(self, fence: Fence | None, fn: Callable[[Any], T]) -> Callable[[Any], T]:
        """`fn` with the engine's refusal of a lost fence raised as LeaseLostError."""
        return fn

    async def _users_changed(self) -> None:
        """Called after a committed change of the users table (an engine may signal it)."""

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        profile_id: str,
        title: str = "",
        user_id: str = "local",
        meta: dict[str, Any] | None = None,
        sessions_max: int | None = None,
        durable: bool = True,
    ) -> SessionRow:
        """A new session row; with `sessions_max`, `LimitError` when `user_id` has that
        many already (counted in the same transaction). `durable=False` as an append's."""
        sid = check_session_id(session_id) if session_id is not None else new_session_id()
        most = check_sessions_max(sessions_max)
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
        full = await self._run(
            f"create session {sid!r}",
            lambda c: self.sql.insert_session(c, row, meta_json, most),
            durable=durable,
        )
        if full is not None and most is not None:
            raise LimitError(sessions_full(full, most))
        return row

    async def get_session(self, session_id: str) -> SessionRow | None:
        sid = check_session_id(session_id)
        return await self._run(
            f"get session {sid!r}", lambda c: self.sql.get_session(c, sid), write=False
        )

    async def list_sessions(self, user_id: str | None = None) -> list[SessionRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run(
            "list sessions", lambda c: self.sql.list_sessions(c, user_id), write=False
        )

    async def update_session(
        self,
        session_id: str,
        *,
        profile_id: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
        durable: bool = True,
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
            self._fenced(fence, lambda c: self.sql.update_session(c, sid, changes, fence)),
            durable=durable,
        )

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its history, context, queue and kv rows `sid` or `sid:…`."""
        sid = check_session_id(session_id)
        return await self._run(f"delete session {sid!r}", lambda c: self.sql.delete_session(c, sid))

    async def count_sessions(self, user_id: str) -> int:
        _check_text(user_id, "user id")
        return await self._run(
            f"count sessions of {user_id}",
            lambda c: self.sql.count_sessions(c, user_id),
            write=False,
        )

    async def append(
        self,
        session_id: str,
        *,
        messages: Sequence[dict[str, Any]] = (),
        context: Sequence[dict[str, Any]] = (),
        durable: bool = True,
        dequeue: str | None = None,
        renew: float | None = None,
        claim: KeyClaim | None = None,
        owes_end: bool = False,
    ) -> None:
        """Append new display messages and context entries in one transaction.

        `durable=False`: committed without waiting for the disk (a killed process keeps
        it; power loss keeps it once a later durable commit has flushed). `dequeue`: the
        key of the queued message being appended; its queued row goes in the same
        transaction (it is never both queued and in history). `renew`: a fenced write
        also extends its lease to `renew` s from now in that transaction, as
        `renew_lease` naming the generation would (without a fence: nothing). `claim`: the
        client key of the user message appended, taken in that transaction (`claim_key`).
        `owes_end`: the save starts a turn (or ends a dead one): the fenced lease owes the
        session that turn's ``stream_end`` from that commit on (`end_owed`); with nothing
        new to append too (a turn started again on a message saved already)."""
        sid = check_session_id(session_id)
        msg_rows = _prepare(messages, "messages")
        # Both lists usually hold the same dicts: each is serialised once. (`messages` is
        # still referenced here, so the ids cannot be reused while this runs.)
        done = {id(m): row for m, row in zip(messages, msg_rows, strict=True)}
        ctx_rows = _prepare(context, "context", done)
        if claim is not None:
            _check_text(claim.key, "message key")
        fence = fence_for(sid)
        owes = owes_end and fence is not None
        if not msg_rows and not ctx_rows and dequeue is None and claim is None and not owes:
            return
        now = self._now()
        ttl = renew if fence is not None else None
        await self._run(
            f"append to session {sid!r}",
            self._fenced(
                fence,
                lambda c: self.sql.append(
                    c,
                    sid,
                    msg_rows,
                    ctx_rows,
                    now,
                    dequeue,
                    fence,
                    durable=durable,
                    renew=ttl,
                    claim=claim,
                    owes_end=owes,
                ),
            ),
            durable=durable,
            # Without a dequeue, a claim, a renewal or a debt an engine may make it one
            # statement, its own transaction.
            transaction=dequeue is not None or ttl is not None or claim is not None or owes,
        )

    async def message_key(self, session_id: str, key: str) -> dict[str, Any] | None:
        """The ok's fields of the message of the session that took client key `key`;
        None when no message did (or it is older than the newest `KEYS_KEPT`)."""
        sid = check_session_id(session_id)
        _check_text(key, "message key")
        return await self._run(
            f"read message key of {sid!r}",
            lambda c: self.sql.message_key(c, sid, key),
            write=False,
        )

    async def load_messages(self, session_id: str) -> list[dict[str, Any]]:
        sid = check_session_id(session_id)
        return await self._run(
            f"load messages of {sid!r}",
            lambda c: self.sql.load_history(c, "messages", sid),
            write=False,
        )

    async def load_messages_page(
        self, session_id: str, *, after: float | None = None, limit: int, max_bytes: int
    ) -> HistoryPage:
        """The display messages after position `after` (from the first without): at most
        `limit`, and no more than `max_bytes` of stored JSON in all, except that a page
        holds one message at least, however big. Only that page is read into memory."""
        sid = check_session_id(session_id)
        check_page(limit, max_bytes)
        return await self._run(
            f"load a page of messages of {sid!r}",
            lambda c: self.sql.load_page(c, sid, after, limit, max_bytes),
            write=False,
        )

    async def load_context(self, session_id: str) -> list[dict[str, Any]]:
        sid = check_session_id(session_id)
        return await self._run(
            f"load context of {sid!r}",
            lambda c: self.sql.load_history(c, "context", sid),
            write=False,
        )

    async def replace_context(self, session_id: str, context: Sequence[dict[str, Any]]) -> None:
        """Compression only: swap the whole LLM context in one transaction."""
        sid = check_session_id(session_id)
        rows = _prepare(context, "context")
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"replace context of {sid!r}",
            self._fenced(fence, lambda c: self.sql.replace_context(c, sid, rows, now, fence)),
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
        """Keep the first `keep` display messages (StoreError when there are fewer),
        append `messages` after them, replace the whole context with `context`, and set
        ``(scope, key, value)`` / delete ``(scope, key)`` kv rows: one transaction."""
        sid = check_session_id(session_id)
        job = _prepare_rewrite(keep, messages, context, kv_set, kv_delete)
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"rewrite history of {sid!r}",
            self._fenced(fence, lambda c: self.sql.rewrite(c, sid, job, now, fence)),
        )

    async def load_session(self, session_id: str) -> LoadedSession | None:
        """Row, messages and context, with dangling tool calls repaired and persisted.

        Call it when no run of this session is live: a run's in-flight tool calls look
        dangling until their results are appended.
        """
        sid = check_session_id(session_id)
        now = self._now()
        fence = fence_for(sid)
        return await self._run(
            f"load session {sid!r}",
            self._fenced(fence, lambda c: self.sql.load_session(c, sid, now, fence)),
            write=False,
        )

    async def enqueue(
        self,
        session_id: str,
        key: str,
        message: dict[str, Any],
        *,
        pid: int,
        host: str,
        keep: int | None = None,
        claim: KeyClaim | None = None,
    ) -> Queued:
        """Keep a queued user message until its run appends it (`append(dequeue=key)`);
        with `keep`, the session's oldest rows beyond the newest `keep` go: (key, message)
        of each, oldest first."""
        sid = check_session_id(session_id)
        _check_text(key, "queued message key")
        data = _dump(message, f"queued message of {sid!r}")
        cap = check_keep(keep)
        now = self._now()
        return await self._run(
            f"queue a message in {sid!r}",
            lambda c: self.sql.enqueue(c, sid, key, data, pid, host, now, cap, claim),
        )

    async def release_queued(
        self, session_id: str, keys: Sequence[str], *, pid: int, host: str
    ) -> int:
        """Hand these queued rows of (pid, host) to whoever runs the session: they become
        anyone's (`HANDED_PID`). How many were (the others are no longer theirs)."""
        sid = check_session_id(session_id)
        wanted = [_check_text(k, "queued message key") for k in keys]
        return await self._run(
            f"release queued messages of {sid!r}",
            lambda c: self.sql.release_queued(c, sid, wanted, pid, host),
        )

    async def unqueue(self, key: str) -> bool:
        """Forget a queued message (dropped from a full queue). False when not there."""
        _check_text(key, "queued message key")
        return await self._run(f"unqueue message {key!r}", lambda c: self.sql.unqueue(c, key))

    async def adopt_queued(self, session_id: str, *, pid: int, host: str) -> Queued:
        """(key, message) of the session's queued messages that no live process owns
        (theirs: same host, pid gone; or ours), in queued order, now owned by `pid`."""
        sid = check_session_id(session_id)
        now = self._now()
        return await self._run(
            f"adopt queued messages of {sid!r}", lambda c: self.sql.adopt(c, sid, pid, host, now)
        )

    async def queued_sessions(self) -> list[str]:
        """Ids of the sessions with queued messages."""
        return await self._run(
            "list sessions with queued messages", self.sql.queued_sessions, write=False
        )

    async def kv_get(self, scope: str, key: str) -> Any | None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        return await self._run(
            f"kv get {scope}/{key}", lambda c: self.sql.kv_get(c, scope, key), write=False
        )

    async def kv_set(self, scope: str, key: str, value: Any, *, durable: bool = True) -> None:
        """Set the value; inside a run, fenced by its lease (store/fence.py)."""
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        data = _dump(value, f"kv value for {scope}/{key}")
        now = self._now()
        fence = current_fence()
        await self._run(
            f"kv set {scope}/{key}",
            self._fenced(fence, lambda c: self.sql.kv_set(c, scope, key, data, now, fence)),
            durable=durable,
        )

    async def kv_delete(self, scope: str, key: str) -> None:
        """Delete the value; inside a run, fenced by its lease (store/fence.py)."""
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        fence = current_fence()
        await self._run(
            f"kv delete {scope}/{key}",
            self._fenced(fence, lambda c: self.sql.kv_delete(c, scope, key, fence)),
        )

    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]:
        _check_text(scope, "kv scope")
        _check_text(prefix, "kv prefix", allow_empty=True)
        return await self._run(
            f"kv list {scope}/{prefix}*", lambda c: self.sql.kv_list(c, scope, prefix), write=False
        )

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
        digest = token_digest(token)
        await self._run(f"create user {name!r}", lambda c: self.sql.insert_user(c, user, digest))
        await self._users_changed()
        return dict(user)

    async def get_user_by_token(self, token: str) -> dict[str, Any] | None:
        digest = token_digest(token)
        return await self._run(
            "find user by token", lambda c: self.sql.user_by_digest(c, digest), write=False
        )

    async def list_users(self) -> list[dict[str, Any]]:
        """Every user (id, name, role, created_at), oldest first; never a token."""
        return await self._run("list users", self.sql.list_users, write=False)

    async def get_user(self, user_id: str) -> dict[str, Any] | None:
        _check_text(user_id, "user id")
        return await self._run(
            f"get user {user_id}", lambda c: self.sql.user_by_id(c, user_id), write=False
        )

    async def get_user_by_name(self, name: str) -> dict[str, Any] | None:
        _check_text(name, "user name")
        return await self._run(
            f"get user {name!r}", lambda c: self.sql.user_by_name(c, name), write=False
        )

    async def remove_user(self, name: str) -> bool:
        """Remove the user called `name`, with their schedules and queued messages (their
        sessions stay); False when unknown."""
        _check_text(name, "user name")
        removed = await self._run(f"remove user {name!r}", lambda c: self.sql.remove_user(c, name))
        if removed:
            await self._users_changed()
        return removed

    async def rotate_user_token(self, name: str, token: str) -> bool:
        """Replace the token of `name`: the old one stops working. False when unknown."""
        _check_text(name, "user name")
        digest = token_digest(token)
        rotated = await self._run(
            f"rotate token of {name!r}", lambda c: self.sql.rotate_token(c, name, digest)
        )
        if rotated:
            await self._users_changed()
        return rotated

    async def claim_lease(
        self, session_id: str, *, owner: str, pid: int, host: str, ttl: float
    ) -> LeaseRow:
        """Take the session's lease for `ttl` s unless a live owner holds it (see base)."""
        sid = check_session_id(session_id)
        _check_text(owner, "lease owner")
        _check_text(host, "lease host")
        now = self._now()
        return await self._run(
            f"claim lease of {sid!r}",
            lambda c: self.sql.claim_lease(c, sid, owner, pid, host, ttl, now),
            # Committed, not flushed: what a run does under it that must last (its
            # message, its round's results) is a durable write, which flushes the log
            # behind the claim. A claim lost to a power cut leaves the row as it was,
            # and the fence (owner and generation) refuses the claimer's writes.
            durable=False,
        )

    async def renew_lease(
        self, session_id: str, *, owner: str, ttl: float, generation: int | None = None
    ) -> bool:
        """Extend our lease by `ttl` s from now; False when it is no longer ours (with
        `generation`: no longer ours as that generation)."""
        sid = check_session_id(session_id)
        now = self._now()
        return await self._run(
            f"renew lease of {sid!r}",
            lambda c: self.sql.renew_lease(c, sid, owner, ttl, generation, now),
            durable=False,  # a renewal lost to a crash only makes the lease end sooner
        )

    async def release_lease(self, session_id: str, *, owner: str) -> None:
        sid = check_session_id(session_id)
        await self._run(
            f"release lease of {sid!r}", lambda c: self.sql.release_lease(c, sid, owner)
        )

    async def end_owed(self, session_id: str) -> bool:
        """Whether the session's lease owes it a turn's end (see base)."""
        sid = check_session_id(session_id)
        return await self._run(
            f"read the lease of {sid!r}", lambda c: self.sql.end_owed(c, sid), write=False
        )

    async def enqueue_wake(
        self,
        wake: QueuedRow,
        *,
        note: tuple[str, str, Any] | None,
        limit: int,
        per: float,
    ) -> bool:
        """Store `note` (scope, key, value) and, unless the session was woken `limit`
        times in the last `per` seconds, queue `wake` and count it: one transaction.
        True when the wake-up was queued."""
        values = queued_values(wake, "wake-up")
        check_limit(limit, per)
        kv = None
        if note is not None:
            scope, key, value = note
            kv = (
                _check_text(scope, "kv scope"),
                _check_text(key, "kv key"),
                _dump(value, f"kv value for {scope}/{key}"),
            )
        now = self._now()
        return await self._run(
            f"queue a wake-up of {wake.session_id!r}",
            lambda c: self.sql.enqueue_wake(c, values, kv, limit, now - per, now),
        )

    async def add_usage(self, keys: Sequence[str], amounts: dict[str, float]) -> None:
        """Add `amounts` (kind -> amount, each 0 or more) to every counter in `keys`."""
        names = check_keys(keys)
        adds = check_amounts(amounts)
        if not names or not any(adds.values()):
            return
        now = self._now()
        await self._run("add usage", lambda c: self.sql.add_usage(c, names, adds, now))

    async def record_run_usage(self, usage: RunUsage) -> None:
        """Keep what one run spent (the accounts); never fenced: what was spent was spent,
        whoever holds the session now."""
        for value, what in (
            (usage.session_id, "session_id"),
            (usage.user_id, "user_id"),
            (usage.profile, "profile"),
            (usage.model, "model"),
        ):
            _check_text(value, what, allow_empty=what == "model")
        if usage.kind not in RUN_KINDS:
            raise StoreError(f"run kind must be one of {', '.join(RUN_KINDS)}, not {usage.kind!r}")
        amounts = (usage.tokens_in, usage.tokens_out, usage.llm_sec, usage.tool_sec)
        if any(not math.isfinite(a) or a < 0 for a in amounts):
            raise StoreError(f"usage amounts must be finite and not negative: {amounts}")
        now = self._now()
        day = time.strftime("%Y-%m-%d", time.gmtime(now))
        await self._run(
            f"record usage of {usage.session_id}",
            lambda c: self.sql.record_run_usage(c, usage, now, day),
        )

    async def usage_report(
        self,
        *,
        by: str = "model",
        user_id: str | None = None,
        session_id: str | None = None,
        since: float | None = None,
    ) -> list[UsageLine]:
        """What the runs spent, summed by `by` (USAGE_GROUPS), model and kind; only a
        user's, a session's, or since a time (seconds since the epoch) when given."""
        if by not in USAGE_GROUPS:
            raise StoreError(f"usage is grouped by one of {', '.join(USAGE_GROUPS)}, not {by!r}")
        where: list[tuple[str, Any]] = []
        for column, value in (("user_id", user_id), ("session_id", session_id)):
            if value is not None:
                _check_text(value, column)
                where.append((column, value))
        if since is not None:
            where.append(("at", float(since)))
        return await self._run(
            f"usage by {by}", lambda c: self.sql.usage_report(c, by, where), write=False
        )

    async def get_usage(self, keys: Sequence[str]) -> dict[str, dict[str, float]]:
        """Each key's counters (zeros for a key never added to)."""
        names = check_keys(keys)
        if not names:
            return {}
        return await self._run("read usage", lambda c: self.sql.get_usage(c, names), write=False)

    async def reserve_usage(self, asks: Sequence[UsageAsk], request: UsageRequest) -> UsageGrant:
        """Take `request` from every key of `asks` within its limits, counting the live
        holds, in one transaction (see store/base.py)."""
        checked, req = check_reserve(asks, request)
        now = self._now()
        return await self._run("reserve usage", lambda c: self.sql.reserve(c, checked, req, now))

    async def settle_usage(
        self, adds: dict[str, dict[str, float]], *, release: Sequence[str] = ()
    ) -> dict[str, dict[str, float]]:
        """Add each key's amounts and drop the holds `release` names, in one transaction;
        the counters of the keys of `adds` after it."""
        amounts = check_adds(adds)
        holds = check_release(release)
        now = self._now()
        return await self._run("settle usage", lambda c: self.sql.settle(c, amounts, holds, now))

    async def create_schedule(self, row: ScheduleRow) -> ScheduleRow:
        values = schedule_values(row)
        return await self._run(
            f"create schedule {row.id!r}", lambda c: self.sql.create_schedule(c, values, row)
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRow | None:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"get schedule {sid!r}", lambda c: self.sql.get_schedule(c, sid), write=False
        )

    async def list_schedules(self, user_id: str | None = None) -> list[ScheduleRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run(
            "list schedules", lambda c: self.sql.list_schedules(c, user_id), write=False
        )

    async def count_schedules(self, user_id: str) -> int:
        _check_text(user_id, "user_id")
        return await self._run(
            f"count schedules of {user_id}",
            lambda c: self.sql.count_schedules(c, user_id),
            write=False,
        )

    async def set_schedule(self, schedule_id: str, *, paused: bool, next_due: float | None) -> bool:
        """Pause or resume, with the next due time; False when there is no such schedule."""
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"update schedule {sid!r}",
            lambda c: self.sql.set_schedule(c, sid, bool(paused), next_due),
        )

    async def delete_schedule(self, schedule_id: str) -> bool:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"delete schedule {sid!r}", lambda c: self.sql.delete_schedule(c, sid)
        )

    async def claim_schedule(
        self,
        schedule_id: str,
        *,
        due: float,
        next_due: float | None,
        run: QueuedRow | None,
        session: NewSession | None = None,
        sessions_max: int | None = None,
    ) -> Claimed:
        """Move the schedule from `due` to `next_due` if nobody did meanwhile (and it is
        not paused); with `run`, queue it (and create `session` first, unless its user
        has `sessions_max` sessions: then the run is skipped and the schedule says why)
        and count the run. All or nothing."""
        sid = _check_text(schedule_id, "schedule id")
        values = None if run is None else queued_values(run, "scheduled run")
        new = None if session is None else new_session_row(session)
        most = check_sessions_max(sessions_max)
        now = self._now()
        return await self._run(
            f"claim schedule {sid!r}",
            lambda c: self.sql.claim(c, sid, float(due), next_due, values, new, most, now),
        )


def new_session_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]
