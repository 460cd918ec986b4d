"""The leases table: which process runs a session right now.

A lease row says "owner X (pid, host) runs this session until expires_at, as its
generation G". The holder renews it while its run lives. A claim wins when there is no
row, the row is the claimer's own, the row has expired, or the row's process is gone
(same host, pid no longer alive): a crashed process never blocks a session for longer
than one TTL, and on its own host not even that. A claim by another owner bumps the
generation (the fencing token, store/fence.py); releasing expires the row but keeps
it, so generations only go up. `check_fence` is the check every fenced write makes in
its transaction.

`_Leases` holds the store's lease methods (mixed into `SQLiteStore`); below it, the
functions that run on the worker thread.
"""

from __future__ import annotations

import os

import attrs
from sqlite_utils import Database

from navi_trio.store._core import _Core
from navi_trio.store._input import _check_text, check_session_id
from navi_trio.store._schema import _write_tx
from navi_trio.store.base import LeaseRow
from navi_trio.store.fence import Fence, lost

_COLS = "session_id, owner, pid, host, expires_at, generation"


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 probes only)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    except OSError:
        return False
    try:  # a zombie is dead too (in a container, PID 1 may never reap it)
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False  # gone since the probe
    except (OSError, IndexError):
        return True  # no /proc: trust the signal probe
    return state not in ("Z", "X")


class _Leases(_Core):
    async def claim_lease(
        self, session_id: str, *, owner: str, pid: int, host: str, ttl: float
    ) -> LeaseRow:
        """Take the session's lease for `ttl` s unless a live owner holds it (see base)."""
        sid = check_session_id(session_id)
        now = self._now()
        lease = LeaseRow(session_id=sid, owner=_check_text(owner, "lease owner"), pid=pid,
                         host=_check_text(host, "lease host"), expires_at=now + ttl,
                         generation=1)  # fmt: skip
        return await self._run(f"claim lease of {sid!r}", lambda db: _claim(db, lease, now))

    async def renew_lease(
        self, session_id: str, *, owner: str, ttl: float, generation: int | None = None
    ) -> bool:
        """Extend our lease by `ttl` s from now; False when it is no longer ours (with
        `generation`: no longer ours as that generation)."""
        sid = check_session_id(session_id)
        until = self._now() + ttl
        # Not flushed: a renewal lost to a power cut only makes the lease end sooner.
        return await self._run(
            f"renew lease of {sid!r}",
            lambda db: _renew(db, sid, owner, until, generation),
            False,
        )

    async def release_lease(self, session_id: str, *, owner: str) -> None:
        sid = check_session_id(session_id)
        await self._run(f"release lease of {sid!r}", lambda db: _release(db, sid, owner))


def _lease_from(row: tuple[str, str, int, str, float, int]) -> LeaseRow:
    return LeaseRow(session_id=row[0], owner=row[1], pid=row[2], host=row[3], expires_at=row[4],
                    generation=row[5])  # fmt: skip


def check_fence(db: Database, fence: Fence | None) -> None:
    """Inside a write transaction: LeaseLostError unless `fence` still holds the lease."""
    if fence is None:
        return
    row = db.execute(
        "SELECT owner, generation FROM leases WHERE session_id = ?", [fence.session_id]
    ).fetchone()
    if row is None or (row[0], row[1]) != (fence.owner, fence.generation):
        raise lost(fence, None if row is None else (row[0], row[1]))


def _claim(db: Database, lease: LeaseRow, now: float) -> LeaseRow:
    """Take the lease unless someone alive holds it; returns whoever holds it after."""
    with _write_tx(db):
        row = db.execute(
            f"SELECT {_COLS} FROM leases WHERE session_id = ?", [lease.session_id]
        ).fetchone()
        if row is not None:
            holder = _lease_from(row)
            dead = holder.host == lease.host and not pid_alive(holder.pid)
            if holder.owner != lease.owner and holder.expires_at > now and not dead:
                return holder
            # Our own row keeps its generation; a takeover is the next one.
            same = holder.owner == lease.owner
            lease = attrs.evolve(lease, generation=holder.generation + (0 if same else 1))
        db.execute(
            f"INSERT INTO leases ({_COLS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id)"
            " DO UPDATE SET owner = excluded.owner, pid = excluded.pid, host = excluded.host,"
            " expires_at = excluded.expires_at, generation = excluded.generation",
            [lease.session_id, lease.owner, lease.pid, lease.host, lease.expires_at,
             lease.generation],
        )  # fmt: skip
        return lease


def _renew(db: Database, sid: str, owner: str, expires_at: float, generation: int | None) -> bool:
    with _write_tx(db):
        cursor = db.execute(
            "UPDATE leases SET expires_at = ? WHERE session_id = ? AND owner = ?"
            " AND (? IS NULL OR generation = ?)",
            [expires_at, sid, owner, generation, generation],
        )
        return bool(cursor.rowcount)


def _release(db: Database, sid: str, owner: str) -> None:
    with _write_tx(db):
        # Expired, not deleted: the generation must never go back (store/fence.py).
        db.execute(
            "UPDATE leases SET expires_at = 0 WHERE session_id = ? AND owner = ?", [sid, owner]
        )
