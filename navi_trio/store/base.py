"""The rows every session store returns, and the `ClusterBus` protocol of the stores that
span several daemons.

The store's methods and the contract they keep are `SessionStore` (store/methods.py),
written once over both engines: the SQLite store (`navi_trio.store.sqlite`, the embedded
default) and the PostgreSQL store (`navi_trio.store.postgres`, several daemons on one
database); `store.factory.open_store(settings)` opens the one `NAVI_DB` names. Nothing
above the store layer knows which (DESIGN.md, "Beyond one process").
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
