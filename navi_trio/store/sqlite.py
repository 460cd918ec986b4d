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

from collections.abc import Callable
from pathlib import Path

import trio

from navi_trio.store import _history, _lease, _queue
from navi_trio.store._core import _Core
from navi_trio.store._input import check_session_id as check_session_id
from navi_trio.store._readonly import read_only_check as read_only_check
from navi_trio.store._readonly import read_only_stats as read_only_stats
from navi_trio.store._schema import SCHEMA_VERSION as SCHEMA_VERSION
from navi_trio.store._schema import SQLiteEngine
from navi_trio.store._users_signal import signal_users_changed, users_marker, watch_users_marker
from navi_trio.store._worker import BUSY_TIMEOUT_S as BUSY_TIMEOUT_S


class _SQLite(SQLiteEngine):
    """The statements whose SQL is SQLite's own; the rest are `Engine`'s."""

    append = staticmethod(_history._append)
    insert_history = staticmethod(_history._insert_history)
    enqueue = staticmethod(_queue._enqueue)
    adopt = staticmethod(_queue._adopt)
    claim_lease = staticmethod(_lease.claim_lease)


class SQLiteStore(_Core):
    """The session store on one SQLite file. Create it with `SQLiteStore.open(path)`."""

    sql = _SQLite()

    @property
    def users_marker(self) -> Path:
        """The file rewritten after every change of the users table (store/_users_signal.py)."""
        return users_marker(self.path)

    async def _users_changed(self) -> None:
        await trio.to_thread.run_sync(signal_users_changed, self.users_marker)

    async def watch_users(
        self,
        changed: Callable[[], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call `changed()` after each committed change of the users table, whichever
        process made it, until cancelled; started once the watch is in place."""
        await watch_users_marker(self.users_marker, changed, task_status=task_status)
