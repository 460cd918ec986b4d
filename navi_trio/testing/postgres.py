"""A throwaway PostgreSQL server on 127.0.0.1, for tests and benchmarks of the PostgreSQL store.

    server = PgServer.start()            # initdb in a temp folder, postgres on a free port
    url = server.create_database()       # a fresh, empty database: its postgresql:// URL
    url = server.schema_database()       # a fresh one with navi's schema already in
    server.halt(); server.resume()       # a restart: clients cut off, the data kept
    server.stop()                        # fast shutdown, the folder removed

As root it runs as ``nobody`` (initdb and postgres refuse root). `fast=True` (tests)
turns off fsync; benchmarks use `fast=False`, as in production. `PgUnavailable` says
why no server could be had. ``NAVI_TEST_STORE=postgres`` makes `open_harness` run on a
fresh database of one such server per test process.

A watcher beside each server (navi_trio/testing/lifeline.py) stops it (fast shutdown)
and removes its folder when the process that started it dies, however it dies.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path
from typing import IO

from navi_trio.testing.lifeline import Lifeline, watch

START_SEC = 60.0  # only a broken start waits this long
TRIES = 3  # another process may take the free port before postgres binds it
USER = "navi"  # the cluster's superuser, trusted on 127.0.0.1
_READY = "database system is ready to accept connections"


class PgUnavailable(Exception):
    """No PostgreSQL server could be started here; the message says why."""


def find_binaries() -> Path | None:
    """The folder holding initdb and postgres: Debian's newest, else PATH's."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for folder in reversed(debian):
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    initdb = shutil.which("initdb")
    if initdb and shutil.which("postgres"):
        return Path(initdb).parent
    return None


class _Log:
    """Drains the server's stderr into a file; `settled` is set once it is ready or ends."""

    def __init__(self, stream: IO[bytes], path: Path) -> None:
        self.lines: list[str] = []
        self.ready = False
        self.settled = threading.Event()
        self._thread = threading.Thread(target=self._drain, args=(stream, path), daemon=True)
        self._thread.start()

    def _drain(self, stream: IO[bytes], path: Path) -> None:
        with path.open("a", encoding="utf-8") as out:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines = [*self.lines[-50:], line]
                out.write(line + "\n")
                out.flush()
                if _READY in line:
                    self.ready = True
                    self.settled.set()
        self.settled.set()

    def join(self) -> None:
        self._thread.join(timeout=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One running throwaway cluster; create databases on it, stop it at the end."""

    def __init__(
        self,
        folder: Path,
        port: int,
        running: _Running,
        argv: list[str],
        ids: tuple[int | None, int | None],
        lifeline: Lifeline,
    ) -> None:
        self.folder = folder
        self.port = port
        self._running = running
        self._lifeline = lifeline
        self._argv = argv  # how it was started (port included): `resume` starts it so again
        self._ids = ids
        self._icu = True
        self._schema: str | None = None  # the migrated database schema_database copies
        self._schema_lock = threading.Lock()

    @classmethod
    def start(cls, *, fast: bool = True) -> PgServer:
        """initdb in a new temp folder and start postgres; PgUnavailable when it cannot."""
        bin_dir = find_binaries()
        if bin_dir is None:
            raise PgUnavailable(
                "no PostgreSQL server binaries (initdb, postgres): install the Debian "
                "package postgresql (.ci/run does, as root)"
            )
        run_as = _unprivileged_user()
        folder = Path(tempfile.mkdtemp(prefix="navi-pg-"))
        lifeline = Lifeline()
        try:
            if run_as is not None:
                os.chown(folder, run_as.pw_uid, run_as.pw_gid)
            ids = (None, None) if run_as is None else (run_as.pw_uid, run_as.pw_gid)
            initdb = [str(bin_dir / "initdb"), "-D", str(folder / "data"), "-U", USER]
            initdb += ["--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]
            init = subprocess.run(
                initdb,
                capture_output=True,
                text=True,
                timeout=START_SEC,
                cwd=folder,
                user=ids[0],
                group=ids[1],
            )
            if init.returncode != 0:
                said = (init.stderr or init.stdout).strip().splitlines()[-3:]
                raise PgUnavailable(f"initdb failed (exit {init.returncode}): {' | '.join(said)}")
            return cls._listen(bin_dir, folder, fast, ids, lifeline)
        except BaseException:
            lifeline.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise

    @classmethod
    def _listen(
        cls,
        bin_dir: Path,
        folder: Path,
        fast: bool,
        ids: tuple[int | None, int | None],
        lifeline: Lifeline,
    ) -> PgServer:
        why = "no attempt"
        settings = ["-c", "listen_addresses=127.0.0.1", "-k", str(folder)]
        settings += ["-c", "max_connections=200", "-c", "shared_buffers=32MB"]
        if fast:
            settings += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        for attempt in range(TRIES):
            port = _free_port()
            data = str(folder / "data")
            argv = [str(bin_dir / "postgres"), "-D", data, "-p", str(port), *settings]
            running = _Running(argv, folder, ids, lifeline)
            if running.log.ready:
                return cls(folder, port, running, argv, ids, lifeline)
            running.stop()
            said = " | ".join(running.log.lines[-4:])
            why = f"postgres did not start (try {attempt + 1}): {said}"
        raise PgUnavailable(why)

    def halt(self) -> None:
        """Stop the server as a restart does (fast shutdown: every client is cut off),
        keeping its data; `resume` starts it again."""
        self._running.stop()

    def resume(self) -> None:
        """Start the halted server again, on the same port and data."""
        running = _Running(self._argv, self.folder, self._ids, self._lifeline)
        if not running.log.ready:
            running.stop()
            said = " | ".join(running.log.lines[-4:])
            raise PgUnavailable(f"postgres did not start again: {said}")
        self._running = running

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The postgres process running now."""
        return self._running.process

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, sql: str) -> None:
        """Run one statement as the superuser on the ``postgres`` database (autocommit)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.encode())

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL. Its collation is ICU's English one where the server
        has ICU, as in production, not ``C``'s byte order: a query that compares navi's names
        without ``COLLATE "C"`` shows up in tests."""
        import psycopg

        name = name or "t_" + uuid.uuid4().hex[:12]
        if self._icu:
            try:
                self.admin(
                    f'CREATE DATABASE "{name}" TEMPLATE template0 LOCALE_PROVIDER icu'
                    " ICU_LOCALE 'en-US' LOCALE 'C'"
                )
                return self.url(name)
            except psycopg.Error:
                self._icu = False  # a server built without ICU
        self.admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def schema_database(self) -> str:
        """A new database with navi's migrations already applied, as a store's first open
        leaves it: a copy (CREATE DATABASE ... TEMPLATE) of one migrated once per server,
        for tests whose subject is not the migration; its URL."""
        import psycopg

        from navi_trio.store.postgres._migrate import migrate

        with self._schema_lock:
            if self._schema is None:
                url = self.create_database("navi_schema")
                with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                    migrate(conn, url)
                self._schema = "navi_schema"
        name = "t_" + uuid.uuid4().hex[:12]
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._schema}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Fast shutdown (clients are disconnected), then the folder is removed."""
        self._running.stop()
        self._lifeline.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class _Running:
    """One postgres process, started here: ready, or given up, once this returns
    (`log.ready`); its stderr drained into the log, and its watcher beside it."""

    def __init__(
        self, argv: list[str], folder: Path, ids: tuple[int | None, int | None], lifeline: Lifeline
    ) -> None:
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at the terminal leaves it to the clean-up
            cwd=folder,
            user=ids[0],
            group=ids[1],
        )
        try:
            self.watcher = watch(
                self.process.pid, stop=signal.SIGINT, remove=folder, lifeline=lifeline
            )
        except BaseException:
            _stop(self.process)
            raise
        assert self.process.stderr is not None
        self.log = _Log(self.process.stderr, folder / "postgres.log")
        self.log.settled.wait(START_SEC)

    def stop(self) -> None:
        """Fast shutdown; its watcher, seeing it end, ends too."""
        _stop(self.process)
        self.log.join()
        self.watcher.wait(timeout=10)


def _unprivileged_user() -> pwd.struct_passwd | None:
    """Who runs the server when we are root (initdb refuses root); None otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        raise PgUnavailable("running as root and there is no user nobody to run postgres") from None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)  # postgres: fast shutdown
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


TEST_STORE_ENV = "NAVI_TEST_STORE"  # "postgres": open_harness runs on a fresh database
_shared: list[PgServer] = []
_databases: dict[str, str] = {}
_shared_lock = threading.Lock()


def shared_database(key: str) -> str:
    """The database for `key` (a test's folder: a harness opened again on the same folder
    finds its data, as on the same SQLite file) on this process's one throwaway server,
    started on first use and stopped at exit; its URL. Blocking."""
    with _shared_lock:
        if not _shared:
            server = PgServer.start()
            atexit.register(server.stop)
            _shared.append(server)
        if key not in _databases:
            _databases[key] = _shared[0].create_database()
        return _databases[key]
