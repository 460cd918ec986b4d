"""The leases table on SQLite: which process runs a session right now.

A lease row says "owner X (pid, host) runs this session until expires_at, as its
generation G". The holder renews it while its run lives; a claim follows the takeover
rule (store/fence.py `takeover`); releasing expires the row but keeps it, so
generations only go up. The fence check every write makes is
`_schema.SQLITE.check_fence`. The functions run on the worker thread.
"""

from __future__ import annotations

import sqlite3

from navi_trio.store._schema import _write_tx
from navi_trio.store.base import LeaseRow
from navi_trio.store.fence import pid_alive as pid_alive
from navi_trio.store.fence import takeover
from navi_trio.store.statements import LEASE_COLS, lease_from


def claim_lease(
    db: sqlite3.Connection, sid: str, owner: str, pid: int, host: str, ttl: float, now: float
) -> LeaseRow:
    """Take the lease unless someone alive holds it; returns whoever holds it after."""
    with _write_tx(db):
        row = db.execute(f"SELECT {LEASE_COLS} FROM leases WHERE session_id = ?", [sid]).fetchone()
        holder = None if row is None else lease_from(row)
        generation = takeover(holder, owner, host, now)
        if generation is None:
            assert holder is not None
            return holder
        lease = LeaseRow(sid, owner, pid, host, now + ttl, generation)
        db.execute(
            f"INSERT INTO leases ({LEASE_COLS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id)"
            " DO UPDATE SET owner = excluded.owner, pid = excluded.pid, host = excluded.host,"
            " expires_at = excluded.expires_at, generation = excluded.generation",
            [sid, owner, pid, host, lease.expires_at, generation],
        )
        return lease
