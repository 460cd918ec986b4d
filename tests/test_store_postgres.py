"""What only the PostgreSQL store has: migrations, the factory, the doctor's report.

The contract both stores keep is in tests/test_store_contract*.py; a server that fails,
is slow or locks in tests/test_store_postgres_failures.py. Here, on the session's
throwaway server (tests/pg_server.py; skipped, saying why, where none can start):

- the schema's migrations run once per database under an advisory lock, a second daemon
  waits for them, a newer schema is refused;
- `NAVI_DB=postgresql://…` selects the store, and psycopg stays out of a SQLite start-up.

Rules: real server, real connections, no sleeps; every test under an absolute timeout.
"""

from __future__ import annotations

import select
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from builders import user
from pg_server import closed_port, sql
from test_cli import forked
from test_startup_imports import imported_by

from navi_trio.errors import ConfigError, StoreError
from navi_trio.settings import Settings
from navi_trio.store.factory import open_store, store_kind, store_report
from navi_trio.store.postgres import PostgresStore
from navi_trio.store.postgres._migrate import LOCK_KEY, SCHEMA_VERSION, migrations
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing.postgres import PgServer

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30


# -- migrations -------------------------------------------------------------------------


async def test_migrations_are_applied_once_and_recorded(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
        async with PostgresStore.open(pg_url) as store:  # applies nothing the second time
            assert await store.get_session("s1") is not None
    rows = await trio.to_thread.run_sync(sql, pg_url, "SELECT version, name FROM schema_migrations")
    assert rows == [(m.version, m.name) for m in migrations()]
    assert rows == [
        (1, "init"), (2, "lease_generation"), (3, "cluster"), (4, "control"), (5, "append"),
        (6, "limits"), (7, "accounts"), (8, "message_keys"), (9, "lease_end_owed"),
    ]  # fmt: skip
    assert SCHEMA_VERSION == 9


async def test_daemons_starting_together_apply_each_migration_once(pg_url: str) -> None:
    opened: list[int] = []

    async def daemon() -> None:
        async with PostgresStore.open(pg_url) as store:
            opened.append(len(await store.list_sessions()))

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(daemon)
    assert opened == [0, 0, 0, 0]
    rows = await trio.to_thread.run_sync(
        sql, pg_url, "SELECT version FROM schema_migrations ORDER BY version"
    )
    assert rows == [(m.version,) for m in migrations()]


async def test_a_second_daemon_waits_for_the_migration_lock_then_finds_it_applied(
    pg_url: str,
) -> None:
    opened = trio.Event()
    with trio.fail_after(TIMEOUT), psycopg.connect(pg_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])  # "another daemon migrates"

        async def second() -> None:
            async with PostgresStore.open(pg_url) as store:
                opened.set()
                assert await store.stats() == dict.fromkeys(
                    ["sessions", "messages", "context", "kv", "users"], 0
                )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await wait_for_lock_waiter(pg_url)
            assert not opened.is_set()

            # The other daemon's migration: the schema, recorded with a date of its own.
            def migrate_there() -> None:
                with other.transaction():
                    other.execute(migrations()[0].sql.encode())
                    other.execute(
                        "CREATE TABLE schema_migrations (version integer PRIMARY KEY,"
                        " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                    )
                    other.execute("INSERT INTO schema_migrations VALUES (1, 'init', '2001-01-01')")
                other.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])  # fmt: skip

            await trio.to_thread.run_sync(migrate_there)
        assert opened.is_set()
    rows = await trio.to_thread.run_sync(
        sql, pg_url,
        "SELECT version, extract(year FROM applied_at) FROM schema_migrations ORDER BY version",
    )  # fmt: skip
    # The first applied once, by the other daemon; the later ones (which it lacked) by us.
    assert rows[0] == (1, 2001) and [r[0] for r in rows] == [m.version for m in migrations()]


async def wait_for_lock_waiter(url: str) -> None:
    """Until a connection waits for the migration lock (bounded by the caller's timeout)."""
    query = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
             " AND objid = %s")  # fmt: skip
    while (await trio.to_thread.run_sync(sql, url, query, (LOCK_KEY,)))[0][0] == 0:
        pass  # one round trip per look, no sleep


async def test_a_database_of_a_newer_navi_is_refused(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url):
            pass
        await trio.to_thread.run_sync(
            sql,
            pg_url,
            "INSERT INTO schema_migrations (version, name) VALUES (%s, 'future')",
            (SCHEMA_VERSION + 1,),
        )
        newer = SCHEMA_VERSION + 1
        with pytest.raises(
            StoreError, match=f"schema version {newer}; this navi knows {SCHEMA_VERSION}"
        ):
            async with PostgresStore.open(pg_url):
                pass


# -- the factory and start-up -------------------------------------------------------------


async def test_navi_db_with_a_url_selects_postgres_and_a_path_sqlite(
    pg_url: str, tmp_path: Path
) -> None:
    on_server = Settings.from_env({"NAVI_DB": pg_url})
    assert on_server.db_url == pg_url and on_server.db_path == Settings().db_path
    assert store_kind(on_server) == "postgresql"
    postgres_url = "postgres://" + pg_url.split("://", 1)[1]
    assert store_kind(Settings.from_env({"NAVI_DB": postgres_url})) == "postgresql"
    on_file = Settings.from_env({"NAVI_DB": str(tmp_path / "n.db")})
    assert (on_file.db_url, on_file.db_path, store_kind(on_file)) == (
        "",
        tmp_path / "n.db",
        "sqlite",
    )
    with trio.fail_after(TIMEOUT):
        async with open_store(Settings.from_env({"NAVI_DB": postgres_url})) as store:
            assert isinstance(store, PostgresStore)
        async with open_store(on_file) as store:
            assert isinstance(store, SQLiteStore) and store.path == tmp_path / "n.db"
    # Given a file (`--db`), the file wins over a server in the environment.
    chosen = Settings.from_env({"NAVI_DB": pg_url}, db_path=tmp_path / "n.db")
    assert (chosen.db_url, store_kind(chosen)) == ("", "sqlite")
    with pytest.raises(ConfigError, match="postgresql://"):
        store_kind(Settings(db_url="mysql://h/db"))


def test_psycopg_stays_out_of_a_start_up_on_a_file(tmp_path: Path) -> None:
    statement = "import navi_trio.cli, navi_trio.cli.run, navi_trio.runtime, navi_trio.cli.doctor"
    assert imported_by(statement, ("psycopg", "psycopg_pool")) == []
    db = str(tmp_path / "n.db")
    opens_a_file = (
        "import trio\nfrom navi_trio.settings import Settings\n"
        "from navi_trio.store.factory import open_store\n"
        "async def main():\n"
        f"    async with open_store(Settings.from_env({{'NAVI_DB': {db!r}}})):\n"
        "        pass\n"
        "trio.run(main)"
    )
    assert imported_by(opens_a_file, ("psycopg", "psycopg_pool")) == []


async def test_the_doctor_report_says_which_server_and_whether_it_answers(
    pg_url: str,
) -> None:
    with trio.fail_after(TIMEOUT):
        fresh = await store_report(Settings(db_url=pg_url))
        assert (fresh["ok"], fresh["existed"], fresh["tables"]) == (True, False, None)
        assert fresh["path"].startswith(f"{pg_url} (PostgreSQL 1")
        # Read-only: looking created nothing.
        assert await trio.to_thread.run_sync(
            sql, pg_url, "SELECT to_regclass('schema_migrations') IS NULL"
        ) == [(True,)]
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
        used = await store_report(Settings(db_url=pg_url))
        assert (used["ok"], used["existed"], used["schema"]) == (
            True, True, {"applied": [1, 2, 3, 4, 5, 6, 7, 8, 9], "known": 9}
        )  # fmt: skip
        assert used["tables"]["sessions"] == 1
        errors: list[str] = []
        with closed_port() as port:
            down_url = f"postgresql://u:pw@127.0.0.1:{port}/x"
            down = await store_report(Settings(db_url=down_url), errors)
        assert down["ok"] is False and "does not answer" in down["error"]
        assert errors == [down["error"]] and "pw" not in down["error"]
        assert down["path"] == f"postgresql://u@127.0.0.1:{port}/x"


async def test_navi_doctor_names_the_server_and_never_its_password(
    pg_server: PgServer, pg_url: str, tmp_path: Path
) -> None:
    import json
    import os

    secret_url = pg_url.replace("navi@", "navi:not-needed-secret@")  # trust: ignored
    env = {**os.environ, "NAVI_DB": secret_url, "XDG_DATA_HOME": str(tmp_path)}
    with closed_port() as port:
        argv = ["doctor", "--llm-url", f"http://127.0.0.1:{port}"]
        with trio.fail_after(TIMEOUT):
            async with PostgresStore.open(pg_url):
                pass
        text = await forked(*argv, env=env, cwd=Path.cwd())
        as_json = await forked(*argv, "--json", env=env, cwd=Path.cwd())
    out = text.out
    assert f"{pg_url} (PostgreSQL 1" in out and "(exists)" in out, out
    assert "rows: context=0, kv=0, messages=0, sessions=0, users=0" in out
    report = json.loads(as_json.out)
    assert report["db"]["ok"] is True and report["settings"]["db_url"] == pg_url
    for said in (out, as_json.out, text.err):
        assert "not-needed-secret" not in said


async def test_navi_users_writes_to_the_server_navi_db_names(pg_url: str, tmp_path: Path) -> None:
    import os

    env = {**os.environ, "NAVI_DB": pg_url, "XDG_DATA_HOME": str(tmp_path)}
    env.pop("NAVI_DATA_DIR", None)
    added = await forked("users", "add", "carol", env=env, cwd=Path.cwd())
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            carol = await store.get_user_by_name("carol")
    assert added.code == 0, added.err
    assert carol is not None and carol["role"] == "user"
    assert not (tmp_path / "navi" / "navi.db").exists()  # no SQLite file on the side


async def test_db_option_takes_a_server_url_as_navi_db_does(pg_url: str, tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("NAVI_DB", "NAVI_DATA_DIR")}
    env["XDG_DATA_HOME"] = str(tmp_path)
    added = await forked("users", "add", "dave", "--db", pg_url, env=env, cwd=Path.cwd())
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            dave = await store.get_user_by_name("dave")
    assert added.code == 0, added.err
    assert dave is not None
    assert not (tmp_path / "navi" / "navi.db").exists()


# -- one round trip per save ------------------------------------------------------------


async def test_an_append_is_one_transaction_all_or_nothing_durable_or_not(
    pg_url: str,
) -> None:
    """An append is one statement (navi_append, migrations/0005) and its own transaction:
    a failing insert takes the session's update, the dequeue and the other rows with it;
    not durable, its commit (that one only) does not wait for the WAL flush. A trigger
    records synchronous_commit as each row goes in, and fails on the word "poison"."""
    sql(pg_url, "CREATE TABLE seen (sync text)")
    sql(pg_url, """CREATE FUNCTION spy() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO seen VALUES (current_setting('synchronous_commit'));
            IF NEW.content = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF;
            RETURN NEW;
        END $$""")  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            for table in ("messages", "context"):
                sql(pg_url, f"CREATE TRIGGER spy BEFORE INSERT ON {table}"
                            " FOR EACH ROW EXECUTE FUNCTION spy()")  # fmt: skip
            await store.create_session("s1", profile_id="p")
            await store.append("s1", messages=[user("one")], durable=False)
            await store.append("s1", messages=[user("two")])
            assert sql(pg_url, "SELECT sync FROM seen") == [("off",), ("on",)]
            await store.enqueue("s1", "k1", user("queued"), pid=1, host="h")
            (before,) = sql(pg_url, "SELECT updated_at FROM sessions WHERE id = 's1'")
            with pytest.raises(StoreError, match="poisoned"):
                await store.append(
                    "s1", messages=[user("three")], context=[user("poison")], dequeue="k1"
                )  # fmt: skip
            assert sql(pg_url, "SELECT updated_at FROM sessions WHERE id = 's1'") == [before]
            assert sql(pg_url, "SELECT key FROM queued") == [("k1",)]
            assert await store.load_messages("s1") == [user("one"), user("two")]
            assert await store.load_context("s1") == []
            with pytest.raises(StoreError, match="no session 'nope' in the store"):
                await store.append("nope", messages=[user("x")])


async def test_text_with_the_array_syntax_in_it_reaches_the_query_columns_as_it_was(
    pg_url: str,
) -> None:
    """The history's rows go to the server as array literals the store writes itself
    (`_history._columns`): quotes, backslashes, braces, commas and the word NULL in a
    role or a content stay what they were, in the query columns as in `data`, through
    an append and through a context replaced (compression) alike."""
    texts = ['say "hi"', "a\\b", "{}", "a,b", "NULL", "null", "", " x ", "line\nnext",
             "é ☃ 𝄞", '\\"{,}\\', "nul\x00here"]  # fmt: skip
    messages = [{"role": t, "content": t, "is_plan": i % 2 == 0} for i, t in enumerate(texts)]
    messages.append({"content": "no role"})
    columns: list[tuple[str | None, str, bool]] = [
        (t.replace("\x00", "\ufffd"), t.replace("\x00", "\ufffd"), i % 2 == 0)
        for i, t in enumerate(texts)
    ]
    columns.append((None, "no role", False))
    query = "SELECT role, content, is_plan FROM {} WHERE session_id = 's1' ORDER BY position"
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
            await store.append("s1", messages=messages, context=messages)
            assert await store.load_messages("s1") == messages
            assert sql(pg_url, query.format("messages")) == columns
            await store.replace_context("s1", messages[::-1])
            assert await store.load_context("s1") == messages[::-1]
            assert sql(pg_url, query.format("context")) == columns[::-1]


def test_the_pools_check_costs_no_round_trip_and_finds_a_cut_connection(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg_pool

    from navi_trio.store.postgres._workers import check_cheaply

    checked: list[object] = []
    real = psycopg_pool.ConnectionPool.check_connection

    def check(conn: psycopg.Connection[Any]) -> None:
        checked.append(conn)
        real(conn)

    monkeypatch.setattr(psycopg_pool.ConnectionPool, "check_connection", staticmethod(check))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        check_cheaply(conn)  # healthy and idle: nothing to read, not asked
        assert checked == []
        sql(pg_url, f"SELECT pg_terminate_backend({conn.info.backend_pid})")
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        assert poller.poll(10_000)  # the server's goodbye arrives
        with pytest.raises(psycopg.OperationalError):
            check_cheaply(conn)
        assert checked == [conn]
