"""The PostgreSQL session store: `SessionStore` for several daemons.

    async with PostgresStore.open("postgresql://navi@db.example/navi") as store:
        row = await store.create_session(profile_id="default")
        await store.append(row.id, messages=[msg], context=[msg])

The contract of store/base.py, on a server that several daemons share. `durable=False`
is ``synchronous_commit = off`` for that one transaction.

How it runs: psycopg 3 with a psycopg_pool pool of at most `pool_size` connections, and
as many worker threads (`_workers`: why not one thread per call); trio never blocks.
Opening connects (within `OPEN_WAIT_S`) and applies the schema's migrations under an
advisory lock (`_migrate`). Leaving `open()` lets the threads finish every queued job,
then closes the pool, shielded and bounded by `close_timeout` seconds of real time.
"""

from __future__ import annotations

from navi_trio.store.postgres import _history as h
from navi_trio.store.postgres import _tables as t
from navi_trio.store.postgres._core import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from navi_trio.store.postgres._core import OPEN_WAIT_S as OPEN_WAIT_S
from navi_trio.store.postgres._core import POOL_SIZE as POOL_SIZE
from navi_trio.store.postgres._core import _Core
from navi_trio.store.postgres._core import check_url as check_url


class _Postgres(t.PgEngine):
    """The statements whose SQL is PostgreSQL's own; the rest are `Engine`'s."""

    append = staticmethod(h.append)
    insert_history = staticmethod(h._insert_history)
    enqueue = staticmethod(t.enqueue)
    adopt = staticmethod(t.adopt)
    claim_lease = staticmethod(t.claim_lease)


class PostgresStore(_Core):
    """The session store on a PostgreSQL database. Create it with `PostgresStore.open(url)`."""

    sql = _Postgres()
