"""Helpers for the browser tests: a real `navi serve` on loopback, the fake LLM server
and a cuttable TCP proxy in a trio loop on a background thread, and headless Chromium
driven by Playwright's sync API from the (plain, synchronous) test functions.

Rules: loopback only; Debian's /usr/bin/chromium (Playwright's own browser download
cannot work here) with the background-networking switches off, so that it reaches for
no outside host; one context per worker, each test's pages closed at its end, and a
fresh context for a test that needs one (`Site.page`); every wait has its own timeout
and every test an absolute deadline (`DEADLINE`, enforced by `deadline`); every process
is ended at the end. Where Chromium or Playwright cannot be had, the tests skip saying why.

A module whose tests need no fresh process shares one daemon and fake LLM among them
(`shared_site`): each test gets a new admin user of its own and a fake LLM with no
script, and a test that leaves a run going hands the next one a fresh daemon.

With NAVI_TEST_SHOTS=1, screenshots of each state go to tests/artifacts/ (ignored by git).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import navi_forks
import pytest
import trio
from daemons import store_user

from navi_trio import wire
from navi_trio.api.auth import new_token
from navi_trio.api.daemon_client import open_daemon
from navi_trio.settings import REPO_ROOT, Settings
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import FakeLLMServer
from navi_trio.testing.lifeline import REAP_SEC, watch

CHROMIUM = os.environ.get("NAVI_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
    "--no-default-browser-check",
]
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
DEADLINE = 150.0  # seconds per test
WAIT_MS = 20_000  # one wait for the page


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does it as root)"
    return None


MISSING = _missing()
needs_browser = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def shot(page: Any, name: str) -> Path | None:
    """A screenshot of the page's state, kept as a test artifact when NAVI_TEST_SHOTS is
    set (0.1 to 0.3 s each, 45 of them: no test reads them)."""
    if not os.environ.get("NAVI_TEST_SHOTS"):
        return None
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


# -- the trio side: fake LLM and proxy on a background thread -------------------------


class Proxy:
    """A TCP forwarder 127.0.0.1:port -> 127.0.0.1:target that a test can cut (every
    connection through it closed at once) or close (new connections refused)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.accepted = 0
        self.refusing = False
        self._scopes: set[trio.CancelScope] = set()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        if self.refusing:
            await client.aclose()
            return
        try:
            server = await trio.open_tcp_stream("127.0.0.1", self.target)
        except OSError:
            await client.aclose()
            return
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pipe, client, server, nursery.cancel_scope)
                    nursery.start_soon(self._pipe, server, client, nursery.cancel_scope)
            finally:
                self._scopes.discard(scope)
        await trio.aclose_forcefully(server)
        await trio.aclose_forcefully(client)

    @staticmethod
    async def _pipe(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    def cut(self) -> int:
        """Close every connection through the proxy; how many there were."""
        scopes = list(self._scopes)
        for scope in scopes:
            scope.cancel()
        return len(scopes)


class Loop:
    """A trio loop on a thread, holding the fake LLM server (and proxies)."""

    def __init__(self) -> None:
        self.llm = FakeLLMServer()
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._thread = threading.Thread(target=lambda: trio.run(self._main), daemon=True)
        self._error: BaseException | None = None

    async def _main(self) -> None:
        try:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.llm.serve)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        except BaseException as exc:  # shown by start() / stop()
            self._error = exc
            self._ready.set()

    def start(self) -> Loop:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the fake LLM loop did not start: {self._error!r}")
        return self

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def add_replies(self, *replies: dict[str, Any]) -> None:
        self.call(self.llm.add_replies, *replies)

    def hold(self) -> None:
        """From now on each chat request waits (the fake's gate) until `release`."""
        self.call(lambda: setattr(self.llm, "gate", trio.Event()))

    def release(self) -> None:
        gate = self.llm.gate
        assert gate is not None, "release without hold"
        self.call(gate.set)

    def held(self) -> int:
        """How many chat requests wait at the gate."""
        return int(self.call(lambda: self.llm.waiting))

    def chat_requests(self) -> int:
        return int(self.call(lambda: len(self.llm.chat_requests)))

    def proxy(self, target: int) -> Proxy:
        proxy = Proxy(target)

        async def begin() -> None:
            assert self._nursery is not None
            await self._nursery.start(proxy.serve)

        self.run(begin)
        return proxy

    def forget(self) -> None:
        """The fake LLM as new (no script, no gate, no hold, no requests seen), on its
        port still: what one test scripted never reaches the next."""

        def renew() -> None:
            host, port = self.llm.host, self.llm.port
            FakeLLMServer.__init__(self.llm)
            self.llm.host, self.llm.port = host, port

        self.call(renew)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.call(self._stop.set)
        self._thread.join(10)


# -- the daemon ---------------------------------------------------------------------------


def clean_env(tmp_path: Path) -> dict[str, str]:
    """os.environ without navi settings, with a private DB and data folder."""
    names = {f.metadata["env"] for f in attrs.fields(Settings)} | {"NAVI_DEBUG", "NAVI_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(
        NAVI_DB=str(tmp_path / "navi.db"),
        NAVI_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=str(REPO_ROOT),
    )
    return env


def test_config(tmp_path: Path) -> Path:
    """The shipped config folder with: no plan for a first message in `general` (one LLM
    call per simple turn), and a `planner` profile that plans its first message."""
    folder = tmp_path / "config"
    shutil.copytree(REPO_ROOT / "config", folder)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    planner = dict(cfg["profiles"]["general"])
    cfg["profiles"]["general"]["planning_first_message"] = False
    planner["description"] = "general, planning its first message"
    cfg["profiles"]["planner"] = planner
    path.write_text(json.dumps(cfg, indent=2))
    return path


class Daemon:
    """`python -m navi_trio serve` on a loopback port, with the fake LLM server.
    `forked`: the same command forked from the tests' warm process (tests/navi_forks.py's
    `attach_command`: a process of its own that gets this one's signals, listening in a
    few tenths of a second instead of a second or two), for the tests whose subject is
    what the daemon serves, not how its interpreter starts or what a killed test leaves."""

    def __init__(self, tmp_path: Path, llm_url: str, *extra: str, forked: bool = False) -> None:
        self.env = clean_env(tmp_path)
        self.data = Path(self.env["NAVI_DATA_DIR"])
        self.db = Path(self.env["NAVI_DB"])
        self.config = test_config(tmp_path)
        self.llm_url = llm_url
        self.extra = extra
        self.forked = forked
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.watcher: subprocess.Popen[bytes] | None = None
        self.log = tmp_path / "serve.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> Daemon:
        args = ["serve", "--port", str(self.port), "--llm-url", self.llm_url]
        args += ["--config", str(self.config), *self.extra]
        if self.forked:
            args = navi_forks.attach_command(*args)
        else:
            args = [sys.executable, "-m", "navi_trio", *args]
        log = open(self.log, "ab")  # noqa: SIM115 - the child holds it
        # As root, what the daemon makes is open to its tool user, as the tests' own files
        # are (tests/tool_user.py): whenever it starts, not only inside a test's tmp_path.
        umask = 0 if os.geteuid() == 0 else -1
        self.proc = subprocess.Popen(
            args, env=self.env, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
            umask=umask,
        )  # fmt: skip
        log.close()
        self.watcher = watch(self.proc.pid)  # it stops the daemon if this process dies
        assert self.proc.stdout is not None
        line = _readline(self.proc, 60)
        found = re.search(r"listening on ws://127\.0\.0\.1:(\d+)/", line)
        assert found, f"navi serve said {line!r}; log:\n{self.log.read_text()[-3000:]}"
        self.port = int(found.group(1))
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        watcher, self.watcher = self.watcher, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if watcher is not None:  # it ends with the daemon
            watcher.wait(REAP_SEC)

    def admin_token(self) -> str:
        return (self.data / "local-token").read_text().strip()

    def add_user(self, name: str, role: str = "user") -> str:
        """A new user's token. Written to the daemon's SQLite file as `navi users add`
        writes it (the store's users marker tells the running daemon), without the
        second of a CLI process's start."""
        return trio.run(store_user, str(self.db), name, role)

    def rotate(self, name: str) -> str:
        """The user's new token (the old one refused from now on), as `navi users rotate`."""
        token = new_token()
        trio.run(self._in_store, lambda store: store.rotate_user_token(name, token))
        return token

    async def _in_store(self, change: Callable[[SQLiteStore], Awaitable[Any]]) -> None:
        async with SQLiteStore.open(self.db) as store:
            await change(store)


def _readline(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The child's first stdout line, or '' after `timeout` seconds."""
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return out[0].decode(errors="replace") if out else ""


# -- the browser ----------------------------------------------------------------------------


DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


class Chromium:
    """The worker's headless Chromium (a Playwright Browser) and its one shared context.

    A page of a test opens in the shared context unless it needs a context of its own
    (`Site.page`): a fresh context costs Chromium more than a page in a shared one, and a
    page's own state (its sessionStorage, where the page keeps the token, its scripts,
    its WebSocket) is the page's anyway. What a context holds beyond that (localStorage,
    permissions, a clock) a test that uses it gets in a context of its own."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self._shared: Any = None

    def new_context(self, **options: Any) -> Any:
        context = self.browser.new_context(**options)
        context.set_default_timeout(WAIT_MS)
        return context

    def shared(self) -> Any:
        if self._shared is None:
            self._shared = self.new_context(viewport=DESKTOP)
        return self._shared

    def clear_shared(self) -> None:
        """Close every page of the shared context (a test's, and the tabs it opened)."""
        if self._shared is not None:
            for page in list(self._shared.pages):
                page.close()


def launched() -> Iterator[Chromium]:
    """Playwright and one headless Chromium, closed at the end (the `chromium` fixture
    of tests/web_worker.py: one per worker process, for every browser module)."""
    if MISSING is not None:
        pytest.skip(MISSING)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000
        )
        yield Chromium(b)
        b.close()


@pytest.fixture(scope="module")
def browser(chromium: Chromium) -> Chromium:
    """The worker's one Chromium (its start and Playwright's were 2 to 3 s a module).
    Playwright's sync API runs one instance per thread at a time, so it is defined once,
    in tests/web_worker.py, not here: a session fixture imported into each module would
    be a fixture of each, a second instance started beside the first. Nothing of one
    test's pages reaches the next (`Site.page`, `Site.close`)."""
    return chromium


# Before the page's own scripts: the token kept in the tab, as the sign-in form keeps it.
SIGNED_IN = "sessionStorage.setItem('navi.token', %s);"


@attrs.define
class Site:
    """What a browser test gets: the loop (fake LLM), the daemon, and pages."""

    loop: Loop
    daemon: Daemon
    browser: Chromium
    contexts: list[Any] = attrs.field(factory=list)
    dialogs: list[str] = attrs.field(factory=list)
    user: str | None = None  # the token of the test's own user (None: the local admin's)

    @property
    def token(self) -> str:
        return self.user or self.daemon.admin_token()

    def page(
        self,
        url: str | None = None,
        *,
        signed_in: bool | str = False,
        script: str | None = None,
        phone: bool = False,
        clock: bool = False,
        own: bool = False,
        **options: Any,
    ) -> Any:
        """A new page at the daemon's page (or `url`). `signed_in`: it starts signed in,
        with the test's user's token (True) or the one given: the token is in the tab
        before the page's scripts run, as a sign-in and a reload leave it, and the page
        is connected when this returns (for the tests whose subject is not the sign-in
        form; `login` fills that in, as a user does). `script` runs before the page's own
        scripts at each load of the page.

        The page opens in the worker's shared context, unless it needs a context of its
        own: `own` (a test of what a context keeps: localStorage), `phone`-sized, `clock`
        (the page's timers on Playwright's clock, which runs at real speed until the
        test jumps it: `page.clock.fast_forward`), or other context `options`."""
        if own or phone or clock or options:
            context = self.browser.new_context(viewport=PHONE if phone else DESKTOP, **options)
            if clock:
                context.clock.install()
            self.contexts.append(context)
        else:
            context = self.browser.shared()
        page = context.new_page()

        def on_dialog(dialog: Any) -> None:  # a playwright Dialog
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        if script is not None:
            page.add_init_script(script)
        if not signed_in:
            page.goto(url or self.daemon.url)
            return page
        token = self.token if signed_in is True else signed_in
        with page.add_init_script(SIGNED_IN % json.dumps(token)):  # this load only
            page.goto(url or self.daemon.url)
        page.wait_for_selector("#conn-state.up")
        return page

    def login(self, page: Any, token: str | None = None) -> None:
        page.fill("#login-token", token or self.token)
        page.click("#login-submit")
        page.wait_for_selector("#conn-state.up")

    def close(self) -> None:
        self.browser.clear_shared()
        for context in self.contexts:
            context.close()


@pytest.fixture
def site(tmp_path: Path, browser: Chromium) -> Iterator[Site]:
    yield from running_site(tmp_path, browser)


@pytest.fixture
def own_site(tmp_path: Path, browser: Chromium) -> Iterator[Site]:
    """In a module of `shared_site`s, a daemon of the test's own: for a test that stops
    or restarts it, or needs the local admin's token."""
    yield from running_site(tmp_path, browser)


def running_site(tmp_path: Path, browser: Chromium, **env: str) -> Iterator[Site]:
    """The site of the `site` and `own_site` fixtures: a daemon of the test's own, with
    `env` added to its environment."""
    started = time.monotonic()
    loop = Loop().start()
    daemon = Daemon(tmp_path, loop.llm.url, forked=True)
    daemon.env.update(env)
    try:
        daemon.start()
        s = Site(loop, daemon, browser)
        try:
            yield s
        finally:
            s.close()
    finally:
        daemon.stop()
        loop.stop()
    took = time.monotonic() - started
    assert took < DEADLINE, f"the test took {took:.0f}s (limit {DEADLINE:.0f}s)"


class Shared:
    """One daemon and fake LLM for the tests of a module, started when a test first asks
    and again after a test that left a run going (`stop` at its end)."""

    def __init__(self, folder: Path, prepare: Callable[[Daemon], None] = lambda d: None) -> None:
        self.folder = folder
        self.prepare = prepare  # what a module gives its daemon before it starts
        self.loop: Loop | None = None
        self.daemon: Daemon | None = None
        self.starts = 0
        self.users = 0

    def ready(self) -> tuple[Loop, Daemon]:
        if self.loop is None or self.daemon is None:
            self.starts += 1
            home = self.folder / f"daemon{self.starts}"
            home.mkdir()
            self.loop = Loop().start()
            self.daemon = Daemon(home, self.loop.llm.url, forked=True)
            self.prepare(self.daemon)
            self.daemon.start()
        return self.loop, self.daemon

    def new_user(self) -> str:
        """The token of a new admin user (admin: the tests' modes and approvals are the
        local admin's)."""
        _, daemon = self.ready()
        self.users += 1
        return daemon.add_user(f"tester{self.users}", "admin")

    def idle(self) -> bool:
        """No session of the daemon has a run going (an admin lists every session)."""
        loop, daemon = self.ready()

        async def busy() -> list[str]:
            with trio.fail_after(30):
                async with open_daemon(f"ws://127.0.0.1:{daemon.port}/", daemon.admin_token()) as d:
                    listed = await d.request(wire.sessions_list())
            return [s["session_id"] for s in listed["sessions"] if s["busy"]]

        return not loop.run(busy)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        if self.loop is not None:
            self.loop.stop()
        self.loop = self.daemon = None


# The frame limit of the worker's shared daemon (the shipped one is 1 MiB): a test of a
# frame over it types this much into the page, which 1 MiB made seconds of work.
SHARED_FRAME_MAX = 64 * 1024


def small_frames(daemon: Daemon) -> None:
    """The worker's shared daemon takes frames of `SHARED_FRAME_MAX` bytes at most."""
    daemon.env["NAVI_WS_FRAME_MAX_BYTES"] = str(SHARED_FRAME_MAX)


@pytest.fixture(scope="module")
def shared(web_shared: Shared) -> Shared:
    """The daemon of the modules with the plain test config: one per worker process for
    all of them (`web_shared` of tests/web_worker.py), as each test has its own user,
    sessions and fake LLM script already (`shared_site`)."""
    return web_shared


def sharing(
    tmp_path_factory: pytest.TempPathFactory, prepare: Callable[[Daemon], None] = lambda d: None
) -> Iterator[Shared]:
    """The body of a `shared` fixture: the worker's (`web_shared`), or that of a module
    whose daemon needs `prepare` (its config or environment changed) before each start:
    that module defines `shared` with it."""
    s = Shared(tmp_path_factory.mktemp("shared"), prepare)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def shared_site(shared: Shared, browser: Chromium) -> Iterator[Site]:
    """A `Site` on the module's daemon (`on_shared`)."""
    yield from on_shared(shared, browser)


def on_shared(shared: Shared, browser: Chromium) -> Iterator[Site]:
    """A `Site` on a shared daemon: a new admin user of the test's own (its sessions
    are its own), the fake LLM forgotten (`Loop.forget`), a fresh browser context per
    page. A daemon with a run still going at the end is stopped, so that run cannot take
    the next test's replies."""
    started = time.monotonic()
    loop, daemon = shared.ready()
    loop.forget()
    s = Site(loop, daemon, browser, user=shared.new_user())
    try:
        yield s
    finally:
        s.close()
        if daemon.proc is None or daemon.proc.poll() is not None or not shared.idle():
            shared.stop()
    took = time.monotonic() - started
    assert took < DEADLINE, f"the test took {took:.0f}s (limit {DEADLINE:.0f}s)"


def send(page: Any, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def answer_text(page: Any) -> str:
    """The text of the last answer in the transcript."""
    return str(page.locator(".lane.main > .answer").last.inner_text())
