"""Which store the settings name: SQLite on a file (the default) or PostgreSQL on a server.

    async with open_store(settings) as store: ...

``NAVI_DB`` holding a ``postgresql://`` (or ``postgres://``) URL sets `Settings.db_url`
and selects the PostgreSQL store; anything else is the SQLite file `Settings.db_path`,
unchanged. psycopg is imported only in the first case, so a start-up on a file never
loads it (tests/test_startup_imports.py).

`store_report(settings)` is `navi doctor`'s look at a server: which one, whether it
answers, its schema version and row counts, read-only (it never migrates).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from navi_trio.errors import ConfigError, NaviError
from navi_trio.settings import Settings, is_db_url
from navi_trio.store.db_url import describe
from navi_trio.store.methods import SessionStore

REPORT_TIMEOUT_S = 5  # navi doctor waits this long for the server


def store_kind(settings: Settings) -> str:
    """``postgresql`` or ``sqlite``; ConfigError for a db_url that is not a server URL."""
    if not settings.db_url:
        return "sqlite"
    if not is_db_url(settings.db_url):
        raise ConfigError(
            f"NAVI_DB={settings.db_url[:40]!r}: a database URL starts with postgresql:// "
            "or postgres://"
        )
    return "postgresql"


def open_store(settings: Settings) -> AbstractAsyncContextManager[SessionStore]:
    """Open the store the settings name; it closes when the block is left."""
    if store_kind(settings) == "postgresql":
        from navi_trio.store.postgres import PostgresStore

        return PostgresStore.open(settings.db_url)
    from navi_trio.store.sqlite import SQLiteStore

    return SQLiteStore.open(settings.db_path)


async def store_report(settings: Settings, errors: list[str] | None = None) -> dict[str, Any]:
    """`navi doctor`'s section for a PostgreSQL store (the caller checks `db_url`); what is
    wrong is also appended to `errors`.

    Keys: ``path`` (the server URL without its password, and its version), ``existed``
    (it has navi's schema), ``ok``, ``schema`` (the migrations applied, and the version
    this navi knows), ``tables`` (row counts, None without a schema) or ``error``."""
    from navi_trio.store.postgres._migrate import SCHEMA_VERSION

    where = describe(settings.db_url)
    report: dict[str, Any] = {"kind": "postgresql", "path": where, "existed": False}
    try:
        found = await trio.to_thread.run_sync(_look, settings.db_url)
    except NaviError as exc:
        report.update(ok=False, error=f"{where}: {exc}", tables=None)
    else:
        applied = found["schema"]
        report.update(
            ok=True,
            path=f"{where} (PostgreSQL {found['server']})",
            existed=bool(applied),
            tables=found["tables"],
            schema={"applied": applied, "known": SCHEMA_VERSION},
        )
        if applied and max(applied) > SCHEMA_VERSION:
            report.update(
                ok=False,
                error=f"{where} has schema version {max(applied)}; this "
                f"navi knows {SCHEMA_VERSION}: use a newer navi",
            )
    if not report["ok"] and errors is not None:
        errors.append(report["error"])
    return report


def _look(url: str) -> dict[str, Any]:
    """Blocking and read-only: the server's version, the schema's, the row counts."""
    import psycopg

    from navi_trio.errors import StoreError
    from navi_trio.store.postgres._errors import first_line
    from navi_trio.store.postgres._migrate import applied_versions
    from navi_trio.store.postgres._tables import TABLES

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=REPORT_TIMEOUT_S) as conn:
            conn.execute("SET default_transaction_read_only = on")
            conn.execute(f"SET statement_timeout = {REPORT_TIMEOUT_S * 1000}")
            row = conn.execute("SHOW server_version").fetchone()
            applied = applied_versions(conn)
            tables = None
            if applied:
                counts = ", ".join(f"(SELECT COUNT(*) FROM {t})" for t in TABLES)
                got = conn.execute(f"SELECT {counts}").fetchone()
                tables = None if got is None else dict(zip(TABLES, map(int, got), strict=True))
            return {"server": None if row is None else row[0], "schema": applied, "tables": tables}
    except psycopg.Error as exc:
        raise StoreError(f"the server does not answer: {first_line(exc)}") from None
