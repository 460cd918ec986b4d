"""A throwaway PostgreSQL server for the PostgreSQL store's tests (issue 20).

`pg_server` is a session-scoped fixture: it starts one cluster
(`navi_trio.testing.postgres.PgServer`: initdb in a temp folder, postgres on a free
127.0.0.1 port, as ``nobody`` when we are root) and stops it at the end of the session.
`pg_url` gives each test a fresh, empty database on it (dropped afterwards). When no
server can be started (no binaries: .ci/run installs Debian's ``postgresql``), every test
that uses them is SKIPPED with the reason (``-rs`` shows it): never silently passed.
"""

from __future__ import annotations

from collections.abc import Iterator

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
