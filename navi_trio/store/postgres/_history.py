"""Sessions and their history on PostgreSQL: the statements whose SQL is this engine's own.

`append`, the write of every round, is one statement (navi_append, migrations/0005): one
round trip, its own transaction. Every write to one session's history first locks that
session's row: writers of one session take turns, so the next position is read after
the previous writer committed. Writers of different sessions never wait for each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import psycopg.errors as pg
from psycopg import sql

from navi_trio.errors import StoreError
from navi_trio.store._input import _Row, not_queued
from navi_trio.store.base import KeyClaim
from navi_trio.store.fence import Fence
from navi_trio.store.postgres import _tables as t
from navi_trio.store.postgres._tables import check_fence
from navi_trio.store.postgres._workers import Conn

NO_SESSION = "NV002"  # navi_append's, for a session that is not there (migrations/0005)


def pg_text(text: str | None) -> str | None:
    """A query column's copy of a text: PostgreSQL text cannot hold NUL (`data` keeps it)."""
    return None if text is None else text.replace("\x00", "\ufffd")


def _columns(rows: Sequence[_Row]) -> list[str]:
    """`rows` as four array literals, role, content, is_plan and data: the parameters of
    an INSERT of many rows (`_insert_history`, navi_append), each cast to its array type
    in the query. Written here, not left to psycopg's list adapter: its escaping of each
    element (a regular expression per element) was most of an append's Python work."""
    return [
        t.text_array(pg_text(r.role) for r in rows),
        t.text_array(pg_text(r.content) for r in rows),
        "{" + ",".join("t" if r.is_plan else "f" for r in rows) + "}",
        t.text_array(r.data for r in rows),
    ]


def _insert_history(
    conn: Conn,
    table: str,
    sid: str,
    rows: Sequence[_Row],
    positions: Sequence[float],
    now: float,
) -> None:
    """One INSERT for all `rows`, at `positions` (an append's go after the last rows, in
    navi_append)."""
    if not rows:
        return
    query = sql.SQL(
        "INSERT INTO {} (session_id, position, role, content, is_plan, data, created_at)"
        " SELECT %s, (%s::float8[])[t.ord], t.role, t.content, t.is_plan, t.data, %s"
        " FROM unnest(%s::text[], %s::text[], %s::bool[], %s::text[])"
        " WITH ORDINALITY AS t(role, content, is_plan, data, ord)"
    ).format(sql.Identifier(table))
    conn.execute(query, [sid, list(positions), now, *_columns(rows)])


def append(
    conn: Conn,
    sid: str,
    msg_rows: list[_Row],
    ctx_rows: list[_Row],
    now: float,
    dequeue: str | None,
    fence: Fence | None = None,
    *,
    durable: bool = True,
    renew: float | None = None,
    claim: KeyClaim | None = None,
    owes_end: bool = False,
) -> None:
    """navi_append (migrations/0005): it fences, locks the session's row and inserts
    after the last rows; one statement, its own transaction (an autocommit job). With
    `dequeue`, a transaction of three: the fence and the session's row first (in that
    order, as navi_append), then the queued row taken off the queue, compare and set
    (NotQueuedError, nothing stored, when another daemon took it first or the cap
    dropped it), then navi_append. With `renew` (and a fence), the lease's expiry is
    extended first, in the same transaction: the row it names stays locked to the
    commit, and a lease that is not the fence's is left alone and refused by the fence.
    With `claim`, the client key is taken before navi_append, in the same transaction.
    With `owes_end` (and a fence), the lease is marked as owing a turn's end first, as
    the renewal (a lease that is not the fence's is left alone and refused by the fence)."""
    owner, generation = (fence.owner, fence.generation) if fence is not None else (None, None)
    try:
        if renew is not None and fence is not None:
            t.PG.renew_lease(conn, sid, fence.owner, renew, fence.generation, now)
        if owes_end and fence is not None:  # (the lease row first, as the renewal)
            t.PG.owe_end(conn, fence)
        if dequeue is not None:
            check_fence(conn, fence)
            t.PG.lock_session(conn, sid)
            taken = conn.execute(
                "DELETE FROM queued WHERE key = %s AND session_id = %s RETURNING 1", [dequeue, sid]
            ).fetchone()
            if taken is None:
                raise not_queued(sid, dequeue)
        if claim is not None:
            t.PG.claim_key(conn, sid, claim, now)
        conn.execute(
            "SELECT navi_append(%s, %s, %s, %s, %s, %s, %s::text[], %s::text[], %s::bool[],"
            " %s::text[], %s::text[], %s::text[], %s::bool[], %s::text[])",
            [sid, owner, generation, now, None, durable, *_columns(msg_rows), *_columns(ctx_rows)],
        )
    except psycopg.Error as exc:
        if exc.sqlstate == NO_SESSION or isinstance(exc, pg.ForeignKeyViolation):
            raise StoreError(f"no session {sid!r} in the store") from None
        raise
