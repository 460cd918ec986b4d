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

Where it lives: `_core` (the pool and its workers, open and close, `_run`, the bus),
the methods in three mixins, each a check, an operation's name and one job on the
workers (`_session_methods`: sessions and history; `_table_methods`: queued messages,
kv, users, leases; `_control_methods`: wake-ups, usage, schedules), and below them the
statements that run on a worker thread (`_history`, `_tables`, `_control`, `_bus`).
`PostgresStore` is the mixins on one `_Core`, as `SQLiteStore` is (store/sqlite.py).
"""

from __future__ import annotations

from navi_trio.store.postgres._control_methods import _Control
from navi_trio.store.postgres._core import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from navi_trio.store.postgres._core import OPEN_WAIT_S as OPEN_WAIT_S
from navi_trio.store.postgres._core import POOL_SIZE as POOL_SIZE
from navi_trio.store.postgres._core import check_url as check_url
from navi_trio.store.postgres._session_methods import _Sessions
from navi_trio.store.postgres._table_methods import _Tables


class PostgresStore(_Sessions, _Tables, _Control):
    """The session store on a PostgreSQL database. Create it with `PostgresStore.open(url)`."""
