"""What every session store offers: the rows it returns and the `SessionStore` protocol.

Two implementations: the SQLite store (`navi_trio.store.sqlite`, the embedded default)
and the PostgreSQL store (`navi_trio.store.postgres`, several daemons on one database);
`store.factory.open_store(settings)` opens the one `NAVI_DB` names. Nothing above the
store layer knows which (DESIGN.md, "Beyond one process"); tests/test_store_contract*.py
hold both to this contract.

Contract every implementation keeps:
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

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs

from navi_trio.store.fence import Fence

# Notified (PostgreSQL) with every committed change of the users table: the daemons on
# the database look at their connections and runs again (core/session/user_watch.py).
USERS_CHANNEL = "navi_users"


@attrs.frozen
class SessionRow:
    id: str
    profile_id: str
    title: str
    user_id: str
    created_at: float
    updated_at: float
    meta: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class LoadedSession:
    """A session as the agent resumes it; `repaired` counts placeholders added now."""

    row: SessionRow
    messages: list[dict[str, Any]]
    context: list[dict[str, Any]]
    repaired: int = 0


@attrs.frozen
class HistoryPage:
    """One page of a session's display history, oldest first (`load_messages_page`).

    `next_after` is the position of its last message when more messages follow (pass it
    back as `after` for the next page), None when this page ends the history."""

    messages: list[dict[str, Any]]
    next_after: float | None


@attrs.frozen
class LeaseRow:
    """Who runs a session: `owner` (one per runtime), its `pid` and `host`, until when."""

    session_id: str
    owner: str
    pid: int
    host: str
    expires_at: float  # wall-clock seconds (SQLite: the store's clock; PostgreSQL: the server's)
    generation: int = 0  # the fencing token: +1 at every takeover by another owner


@attrs.frozen
class ScheduleRow:
    """A scheduled run (core/triggers/schedules.py): whose, where, when, what.

    `session_id` None: each run starts a new session of `profile_id`. `kind` is
    ``cron`` (a cron expression), ``every`` (seconds) or ``at`` (one time, ISO 8601);
    `spec` is its text. `next_due` is the wall-clock time of the next run (None: none
    left, an ``at`` that ran). `catch_up`: a due time missed while no daemon ran is run
    once at start-up (else skipped). `budget` lowers the run's budgets (the shape of a
    message's ``budget``)."""

    id: str
    user_id: str
    session_id: str | None
    profile_id: str | None
    kind: str
    spec: str
    message: str
    catch_up: bool
    paused: bool
    next_due: float | None
    created_at: float
    runs: int = 0
    last_run_at: float | None = None
    last_session_id: str | None = None
    budget: dict[str, Any] = attrs.field(factory=dict)
    last_skip: str | None = None  # why the last due time ran nothing (None: it ran)
    last_skip_at: float | None = None


@attrs.frozen
class Claimed:
    """What `claim_schedule` did: `claimed` the due time (False: another daemon did, or
    the schedule changed meanwhile); `skipped`, why its run was not queued (the owner
    has as many sessions as allowed), None when it was. True when claimed."""

    claimed: bool
    skipped: str | None = None

    def __bool__(self) -> bool:
        return self.claimed


@attrs.frozen
class QueuedRow:
    """A message to queue in the same transaction as a claim or a note: it runs when
    its session's actor takes it (core/session/queued.py)."""

    session_id: str
    key: str
    message: dict[str, Any]
    pid: int
    host: str


KEYS_KEPT = 1000  # client message keys a session remembers (the newest; docs/pages/protocol.md)


@attrs.frozen
class KeyClaim:
    """A client's key for one message of a session (the ``message`` frame's ``key``),
    taken in the transaction that stores the message: `message_id` is the message's
    own (the same on every try of its save), `reply` the fields of the ok its sender got
    (seq, epoch, queued, on_busy): a second sender of the key gets them again."""

    key: str
    message_id: str
    reply: dict[str, Any] = attrs.field(factory=dict, hash=False)


@attrs.frozen
class NewSession:
    """A session to create in the same transaction as a schedule's claim."""

    session_id: str
    profile_id: str
    user_id: str
    title: str = ""


USAGE_KINDS = ("tokens", "tool_calls", "subagents", "wall_sec")
# What a run's usage is kept as (`record_run_usage`): its own run, a synchronous
# sub-agent's, a background job's (both billed to the session that started them).
RUN_KINDS = ("turn", "subagent", "job")
# What `usage_report` may group by.
USAGE_GROUPS = ("model", "profile", "day", "session", "user")


@attrs.frozen
class RunUsage:
    """What one run spent, kept for the accounts (`navi usage`): tokens as the model
    reported them, and the run's time waiting for the model and for its tools."""

    session_id: str  # billed to: a sub-agent's or a job's parent session
    user_id: str
    profile: str
    model: str
    kind: str  # RUN_KINDS
    tokens_in: int
    tokens_out: int
    llm_sec: float
    tool_sec: float


@attrs.frozen
class UsageLine:
    """One line of a usage report: a group's value (`key`), split by model and kind."""

    key: str
    model: str
    kind: str
    runs: int
    tokens_in: int
    tokens_out: int
    llm_sec: float
    tool_sec: float


# A queued row of this pid (and host) is anyone's: handed to whoever runs the session.
HANDED_PID = 0
HANDED_HOST = "*"


@attrs.frozen
class UsageAsk:
    """One counter key `reserve_usage` takes from, with its limits (kind -> limit; a
    kind with no limit is absent)."""

    key: str
    limits: dict[str, float]


@attrs.frozen
class UsageRequest:
    """What `reserve_usage` is asked for.

    `want`: kind -> amount; each kind is granted the least room any key has left, and
    refused below `least` (kind -> the least that will do; absent: all it wants).
    `full`: kinds that ask nothing but refuse once a key is at its limit (wall time).
    `hold`: an id to hold the grant under until `settle_usage`; None: spent at once.
    The holder is `pid` on `host` (a hold of a dead pid on the caller's host holds
    nothing); a hold lasts `ttl` seconds at most."""

    want: dict[str, float]
    least: dict[str, float] = attrs.field(factory=dict)
    full: tuple[str, ...] = ()
    hold: str | None = None
    pid: int = 0
    host: str = ""
    ttl: float = 600.0


@attrs.frozen
class UsageGrant:
    """`reserve_usage`'s answer: `granted` (kind -> amount taken; empty when refused),
    `refused` (the key and kind whose limit refused, or None), and each key's counters
    (`spent`) and live holds (`held`, this one's included) as the decision saw them."""

    granted: dict[str, float]
    refused: tuple[str, str] | None
    spent: dict[str, dict[str, float]]
    held: dict[str, dict[str, float]]


class SessionStore(Protocol):
    """Sessions, their display history and LLM context, kv values and users."""

    # sessions
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
        ...

    async def get_session(self, session_id: str) -> SessionRow | None: ...
    async def list_sessions(self, user_id: str | None = None) -> list[SessionRow]: ...
    async def update_session(
        self,
        session_id: str,
        *,
        profile_id: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
        durable: bool = True,
    ) -> None: ...
    async def delete_session(self, session_id: str) -> bool: ...

    # history: append what is new
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
    ) -> None: ...
    async def message_key(self, session_id: str, key: str) -> dict[str, Any] | None:
        """The ok's fields of the message of the session that took client key `key`;
        None when no message did (or it is older than the newest `KEYS_KEPT`)."""
        ...

    async def load_messages(self, session_id: str) -> list[dict[str, Any]]: ...
    async def load_messages_page(
        self, session_id: str, *, after: float | None = None, limit: int, max_bytes: int
    ) -> HistoryPage:
        """The display messages after position `after` (from the first without): at most
        `limit`, and no more than `max_bytes` of stored JSON in all, except that a page
        holds one message at least, however big. Only that page is read into memory."""
        ...

    async def load_context(self, session_id: str) -> list[dict[str, Any]]: ...
    async def replace_context(self, session_id: str, context: Sequence[dict[str, Any]]) -> None: ...
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
        ...

    async def load_session(self, session_id: str) -> LoadedSession | None: ...

    # queued user messages: kept until `append(dequeue=key)` moves one into history
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
    ) -> list[tuple[str, dict[str, Any]]]: ...
    async def unqueue(self, key: str) -> bool: ...
    async def release_queued(
        self, session_id: str, keys: Sequence[str], *, pid: int, host: str
    ) -> int: ...
    async def adopt_queued(
        self, session_id: str, *, pid: int, host: str
    ) -> list[tuple[str, dict[str, Any]]]: ...
    async def queued_sessions(self) -> list[str]: ...

    # kv: JSON values under (scope, key)
    async def kv_get(self, scope: str, key: str) -> Any | None: ...
    async def kv_set(self, scope: str, key: str, value: Any, *, durable: bool = True) -> None: ...
    async def kv_delete(self, scope: str, key: str) -> None: ...
    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]: ...

    # users
    async def create_user(self, name: str, token: str, role: str = "user") -> dict[str, Any]: ...
    async def get_user_by_token(self, token: str) -> dict[str, Any] | None: ...
    async def list_users(self) -> list[dict[str, Any]]: ...
    async def get_user(self, user_id: str) -> dict[str, Any] | None: ...
    async def get_user_by_name(self, name: str) -> dict[str, Any] | None: ...
    async def remove_user(self, name: str) -> bool: ...
    async def rotate_user_token(self, name: str, token: str) -> bool: ...
    async def count_sessions(self, user_id: str) -> int: ...

    # leases: one owner runs a session at a time, across processes
    async def claim_lease(
        self, session_id: str, *, owner: str, pid: int, host: str, ttl: float
    ) -> LeaseRow: ...
    async def renew_lease(
        self, session_id: str, *, owner: str, ttl: float, generation: int | None = None
    ) -> bool: ...
    async def release_lease(self, session_id: str, *, owner: str) -> None: ...
    async def end_owed(self, session_id: str) -> bool: ...

    # wake-ups: a background job's note, and a queued turn that reads it (core/triggers/wake.py)
    async def enqueue_wake(
        self,
        wake: QueuedRow,
        *,
        note: tuple[str, str, Any] | None,
        limit: int,
        per: float,
    ) -> bool: ...

    # usage counters of the budgets (core/turn/budgets.py): key -> {kind: amount}
    async def add_usage(self, keys: Sequence[str], amounts: dict[str, float]) -> None: ...
    async def get_usage(self, keys: Sequence[str]) -> dict[str, dict[str, float]]: ...
    async def record_run_usage(self, usage: RunUsage) -> None: ...
    def observe_writes(self, seconds: Callable[[float], None] | None) -> None: ...
    def use_clock(self, wall: Callable[[], float]) -> None: ...
    async def usage_report(
        self,
        *,
        by: str = "model",
        user_id: str | None = None,
        session_id: str | None = None,
        since: float | None = None,
    ) -> list[UsageLine]: ...
    async def reserve_usage(
        self, asks: Sequence[UsageAsk], request: UsageRequest
    ) -> UsageGrant: ...
    async def settle_usage(
        self, adds: dict[str, dict[str, float]], *, release: Sequence[str] = ()
    ) -> dict[str, dict[str, float]]:
        """Add each key's amounts and drop the holds `release` names, in one transaction;
        the counters of the keys of `adds` after it."""
        ...

    # schedules (core/triggers/schedules.py)
    async def create_schedule(self, row: ScheduleRow) -> ScheduleRow: ...
    async def get_schedule(self, schedule_id: str) -> ScheduleRow | None: ...
    async def list_schedules(self, user_id: str | None = None) -> list[ScheduleRow]: ...
    async def count_schedules(self, user_id: str) -> int: ...
    async def set_schedule(
        self, schedule_id: str, *, paused: bool, next_due: float | None
    ) -> bool: ...
    async def delete_schedule(self, schedule_id: str) -> bool: ...
    async def claim_schedule(
        self,
        schedule_id: str,
        *,
        due: float,
        next_due: float | None,
        run: QueuedRow | None,
        session: NewSession | None = None,
        sessions_max: int | None = None,
    ) -> Claimed: ...

    # health
    async def stats(self) -> dict[str, int]: ...


class ClusterBus(Protocol):
    """Messages between daemons on one database, and the rows that say who is alive.

    Offered by a store that several daemons share (PostgreSQL: `PostgresStore.bus()`,
    LISTEN / NOTIFY); core/cluster/cluster.py is its one user."""

    def on_message(self, callback: Callable[[str, str], None]) -> None: ...
    def on_reconnect(self, callback: Callable[[], None]) -> None: ...
    @property
    def up(self) -> bool: ...
    def listening(self) -> AbstractAsyncContextManager[None]: ...
    async def listen(self, channel: str) -> None: ...
    async def unlisten(self, channel: str) -> None: ...
    async def notify(
        self,
        items: Sequence[tuple[str, str]],
        fences: Sequence[Fence | None] | None = None,
        ended: Sequence[Fence] = (),
    ) -> None: ...
    async def fetch_frame(self, ref: int) -> str | None: ...
    async def heartbeat(self, owner: str, pid: int, host: str, ttl: float) -> None: ...
    async def leave(self, owner: str) -> None: ...
    async def live_daemons(self) -> list[tuple[str, int, str]]: ...
    async def follow(self, session_id: str, owner: str, follow: bool) -> None: ...
    async def follows(self) -> list[tuple[str, str]]: ...
    async def lease(self, session_id: str) -> tuple[LeaseRow, float] | None: ...
    async def take_abandoned(
        self, lease: LeaseRow, owner: str, pid: int, host: str, ttl: float, *, dead: bool
    ) -> int | None: ...
    async def orphans(self, owner: str, dead: Sequence[str]) -> list[str]: ...
    async def take_slot(
        self,
        key: str,
        kind: str,
        owner: str,
        claims: Sequence[tuple[str, int]],
        rate: tuple[str, int, float] | None = None,
    ) -> str | None: ...
    async def free_slot(self, key: str, *, keep: bool) -> None: ...
