"""The PostgreSQL schema: numbered migrations, applied at start-up under an advisory lock.

Each file ``migrations/NNNN_name.sql`` (package data) is one migration; its number is its
version. Opening a store takes ``pg_advisory_lock`` on this database, creates
``schema_migrations`` (version, name, applied_at) when missing, applies in order each
migration it does not list, each in its own transaction together with its row, and
lets go of the lock. A second daemon starting at the same time waits at the lock (at
most the connection's ``lock_timeout``), then finds everything applied and applies
nothing. A database that lists a version this navi does not know was migrated by a
newer navi: the store refuses to open it rather than guess.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, NamedTuple

import psycopg

from navi_trio.errors import StoreError

# pg_advisory_lock's key for the migrations ("navi" in ASCII): held only while migrating.
LOCK_KEY = 0x6E617669
_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


class Migration(NamedTuple):
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """The migrations this navi ships, in version order."""
    found = []
    for entry in (resources.files(__package__) / "migrations").iterdir():
        match = _FILE.fullmatch(entry.name)
        if match is not None:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort()
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise StoreError(f"the shipped migrations are not numbered 1..n: {found}")
    return found


SCHEMA_VERSION = len(migrations())


def migrate(conn: psycopg.Connection[tuple[Any, ...]], where: str) -> list[int]:
    """Apply what `conn`'s database lacks (conn in autocommit mode); the versions applied."""
    shipped = migrations()
    conn.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {int(r[0]) for r in conn.execute("SELECT version FROM schema_migrations")}
        newest = max(done, default=0)
        if newest > len(shipped):
            raise StoreError(
                f"the database {where} has schema version {newest}; this navi knows "
                f"{len(shipped)}: use a newer navi"
            )
        applied = []
        for migration in shipped:
            if migration.version in done:
                continue
            with conn.transaction():
                conn.execute(migration.sql.encode())  # several statements, no parameters
                conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                    [migration.version, migration.name],
                )
            applied.append(migration.version)
        return applied
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])


def applied_versions(conn: psycopg.Connection[tuple[Any, ...]]) -> list[int] | None:
    """The versions a database lists, None when it has no schema_migrations (read-only)."""
    row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return None
    return [int(r[0]) for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]
