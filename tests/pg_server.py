"""A throwaway PostgreSQL server for the PostgreSQL store's tests (issue 20).

`pg_server` is a session-scoped fixture (registered in tests/conftest.py, so the whole
session shares it): it starts one cluster (`navi_trio.testing.postgres.PgServer`: initdb
in a temp folder, postgres on a free 127.0.0.1 port, as ``nobody`` when we are root) and
stops it at the end of the session.
`pg_url` gives each test a fresh, empty database on it (dropped afterwards);
`pg_url_with_schema`, imported by a module, makes its `pg_url` a fresh database with
navi's schema already in.
`own_pg` is a server of the test's own, with a database: (server, url), for a test that
halts and resumes the server (a restart, an outage) under its clients. `sql` runs
one statement on a connection of its own, `cut_connections` ends every other connection
to a database (a server restart, for its clients), `closed_port` is a port nobody
listens on. When no
server can be started (no binaries: .ci/run installs Debian's ``postgresql``), every test
that uses them is SKIPPED with the reason (``-rs`` shows it): never silently passed.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from navi_trio.testing.postgres import PgServer, PgUnavailable


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    try:
        server = PgServer.start()
    except PgUnavailable as exc:
        pytest.skip(f"no PostgreSQL server for the PostgreSQL store's tests: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh database of the session's server: its postgresql:// URL."""
    url = pg_server.create_database()
    try:
        yield url
    finally:
        pg_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(name="pg_url")
def pg_url_with_schema(pg_server: PgServer) -> Iterator[str]:
    """`pg_url` with navi's schema already in (a copy of a database migrated once per
    server), for a module whose subject is not the migration: it imports this fixture,
    which then stands for `pg_url` there. Saves a migration per test."""
    url = pg_server.schema_database()
    try:
        yield url
    finally:
        pg_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture
def own_pg() -> Iterator[tuple[PgServer, str]]:
    """A server of this test's own (to halt and resume it) and a database on it."""
    try:
        server = PgServer.start()
    except PgUnavailable as exc:
        pytest.skip(f"no PostgreSQL server for the PostgreSQL store's tests: {exc}")
    try:
        yield server, server.create_database()
    finally:
        server.stop()


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own (autocommit); its rows, if any."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement.encode(), params)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def cut_connections(url: str) -> None:
    """Terminate every other connection to `url`'s database (a server restart, for them),
    and wait until each is gone (10 s at most): their clients have been told by then."""
    sql(url, "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
             " WHERE datname = current_database() AND pid <> pg_backend_pid()")  # fmt: skip


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port nobody listens on (bound, not listening: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])
