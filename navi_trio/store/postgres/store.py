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

Where it lives: the methods are store/methods.py's, written once for both engines;
`_Postgres` below is this engine's statements for them, run on a worker thread
(`_history`: sessions and history; `_tables`: queued messages, kv, users, leases;
`_control`: wake-ups, usage, schedules). `_core` has the pool and its workers, open
and close, `_run`; `_bus` the LISTEN / NOTIFY between daemons; `_migrate` the schema.
"""

from __future__ import annotations

from navi_trio.store.postgres import _control as ctl
from navi_trio.store.postgres import _history as h
from navi_trio.store.postgres import _tables as t
from navi_trio.store.postgres._core import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from navi_trio.store.postgres._core import OPEN_WAIT_S as OPEN_WAIT_S
from navi_trio.store.postgres._core import POOL_SIZE as POOL_SIZE
from navi_trio.store.postgres._core import _Core
from navi_trio.store.postgres._core import check_url as check_url


class _Postgres(t.PgEngine):
    """The PostgreSQL statements of store/statements.py's `Engine`: the shared ones
    (store/statements.py) on this engine, and those whose SQL is its own."""

    insert_session = staticmethod(h.insert_session)
    append = staticmethod(h.append)
    insert_history = staticmethod(h._insert_history)
    enqueue = staticmethod(t.enqueue)
    release_queued = staticmethod(t.release_queued)
    adopt = staticmethod(t.adopt)
    insert_user = staticmethod(t.insert_user)
    user_by_name = staticmethod(t.user_by_name)
    remove_user = staticmethod(t.remove_user)
    claim_lease = staticmethod(t.claim_lease)
    renew_lease = staticmethod(t.renew_lease)
    reserve = staticmethod(ctl.reserve)
    settle = staticmethod(ctl.settle)
    create_schedule = staticmethod(ctl.create_schedule)


class PostgresStore(_Core):
    """The session store on a PostgreSQL database. Create it with `PostgresStore.open(url)`."""

    sql = _Postgres()
