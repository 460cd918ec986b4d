"""Fixtures every test module may ask for by name, without importing them.

- `env`: os.environ without any navi setting, plus a private NAVI_DB and NAVI_DATA_DIR
  under tmp_path: the environment of a real `navi` subprocess (tests/test_cli.py ...).
  tests/test_client_real.py widens it for a terminal client.
- `pg_server`, `pg_url`: the session's throwaway PostgreSQL server and a fresh database
  on it (defined in tests/pg_server.py); `backend`: both session stores behind one face,
  for the contract suite (defined in tests/store_backends.py). Registered here, once, so
  the whole session shares one server (a session fixture imported into several modules
  is a separate fixture in each, and would start a server per module).
- `chromium`, `web_shared`: the browser tests' one Chromium and one shared daemon per
  worker process (defined in tests/web_worker.py), registered here for the same reason.

Hooks: a test not marked ``slow`` that starts a process fails (tests/slow_guard.py), so
that `python -m pytest -m "not slow"` stays the quick run; that run imports no module
whose tests are all slow and runs a fifth of each property test's examples
(tests/quick_run.py).

Helpers that are plain functions are modules beside this one, imported by name as the
test modules import each other (tests/ is on sys.path; mypy finds them the same way):
tests/builders.py (history messages), tests/api_ws.py (a daemon and its WebSocket
clients), tests/agent_tools.py (tools and fake-LLM replies for the agent), ...
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from pathlib import Path

import attrs
import hypothesis
import pytest
import quick_run
import workers
from _pytest.pathlib import LOCK_TIMEOUT, make_numbered_dir_with_cleanup
from pg_server import pg_server as pg_server
from pg_server import pg_url as pg_url
from slow_guard import refusing_processes
from store_backends import backend as backend
from tool_user import open_to_tools
from web_worker import chromium as chromium
from web_worker import web_shared as web_shared

from navi_trio.settings import Settings
from navi_trio.tools.runas import run_as
from navi_trio.tools.sandbox import sandbox_available


def pytest_configure(config: pytest.Config) -> None:
    """The quick run is known before any test module is imported. No COLUMNS or LINES:
    the tests' terminal clients run in pseudo-terminals of a set size, and rich takes
    these variables over the terminal's own size; an xdist worker starts with
    COLUMNS=80 LINES=24 in its environment, so every chat under the workers wrapped at
    80 columns and a line the test waits for was cut in two."""
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    quick_run.quick = quick_run.is_quick_run(config.getoption("markexpr"))
    # Hypothesis's two clocks (an example's 200 ms deadline, the too-slow check on
    # drawing inputs) are measures of the machine, not of the code: on a loaded CI
    # machine they failed tests whose property held. A test that is about time says so
    # with a clock of its own.
    hypothesis.settings.register_profile(
        "navi", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
    )
    hypothesis.settings.load_profile("navi")
    if quick_run.quick:  # a property test that names no count: a fifth of the default
        default = hypothesis.settings().max_examples
        hypothesis.settings.register_profile(
            "quick", hypothesis.settings(), max_examples=quick_run.examples(default)
        )
        hypothesis.settings.load_profile("quick")
    open_base_temp(config)


def open_base_temp(config: pytest.Config) -> None:
    """As root, the run's temporary folders go under TMPDIR/navi-tests-of-root (0o711),
    not pytest's pytest-of-root: every pytest run that starts as root takes the group and
    other bits off pytest-of-root, and the tool user of a test running meanwhile could
    no longer reach the test's folder (a hook's record, an MCP server's marker missing).
    Numbered, locked and cleaned up like pytest's own; an explicit --basetemp, and an
    xdist worker (given its controller's), are left as they are."""
    if os.geteuid() != 0 or config.option.basetemp or hasattr(config, "workerinput"):
        return
    root = Path(tempfile.gettempdir()).resolve() / "navi-tests-of-root"
    root.mkdir(mode=0o711, exist_ok=True)
    mode = root.lstat()
    if stat.S_ISLNK(mode.st_mode) or mode.st_uid != 0:
        raise OSError(f"{root} is not a folder of root's own")
    root.chmod(0o711)
    cleanups = ExitStack()
    config.add_cleanup(cleanups.close)
    run = make_numbered_dir_with_cleanup(
        root=root,
        prefix="run-",
        mode=0o711,
        keep=int(config.getini("tmp_path_retention_count")),
        lock_timeout=LOCK_TIMEOUT,
        register=cleanups.callback,
    )
    config.option.basetemp = str(run / "base")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many xdist workers `-n auto` starts (tests/workers.py)."""
    return workers.auto_workers(config.args, os.environ, len(os.sched_getaffinity(0)))


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say so when property tests run fewer examples than the whole suite's."""
    if not quick_run.quick:
        return None
    return (
        f"quick run: modules whose tests are all slow are not imported; property tests run "
        f"1/{quick_run.QUICK_SHARE} of their examples (all of them without -m 'not slow')"
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the quick run, a test module whose every test is slow is not imported."""
    name = collection_path.name
    if quick_run.quick and name.startswith("test_") and name.endswith(".py"):
        if quick_run.whole_module_slow(collection_path.read_bytes()):
            return True
    return None


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """pytest's own, opened to the tool user when the suite runs as root
    (tests/tool_user.py), and what the test makes (umask 0) open too."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    open_to_tools(tmp_path)
    mask = os.umask(0)
    try:
        yield tmp_path
    finally:
        os.umask(mask)


@pytest.fixture(autouse=True, scope="session")
def own_config_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """An empty config home for the whole run: a developer's own ~/.config/navi
    (AGENTS.md, skills, commands) never reaches what the tests' runs are sent."""
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config-home"))
    yield
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """os.environ without any navi setting, plus a private DB and data dir."""
    # Read outside Settings; a developer's OTEL_* must not make a test's daemon export.
    others = {"NAVI_DEBUG", "NAVI_TOKEN", "NAVI_DAEMON_USERS", "NAVI_OTEL_CONTENT",
              "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
              "OTEL_SDK_DISABLED"}  # fmt: skip
    names = {f.metadata["env"] for f in attrs.fields(Settings)} | others
    clean = {k: v for k, v in os.environ.items() if k not in names}
    clean.update(NAVI_DB=str(tmp_path / "navi.db"), NAVI_DATA_DIR=str(tmp_path / "data"))
    return clean


_GUARD = pytest.StashKey[tuple[ExitStack, list[str]]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None]:
    """A test not marked slow starts no process, from its fixtures' setup (a session's
    PostgreSQL server started for it too) to their teardown (pytest_runtest_teardown)."""
    if item.get_closest_marker("slow") is None:
        # The sandbox probe every runtime makes (it runs bwrap) is cached per process,
        # 8 bwraps and users at most: tests that probe broken bwraps push the real one
        # out, and whichever test came next re-ran it. Made here, outside the guard, it
        # is no test's process start, whatever order the tests run in.
        sandbox_available(None, run_as(""))
        stack, seen = ExitStack(), list[str]()
        stack.enter_context(refusing_processes(item.nodeid, seen))
        item.stash[_GUARD] = (stack, seen)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None]:
    """The guard ends; a refused start fails the test, also one the code caught."""
    try:
        return (yield)
    finally:
        if _GUARD in item.stash:
            stack, seen = item.stash[_GUARD]
            stack.close()
            if seen:
                pytest.fail(
                    f"{item.nodeid} is not marked slow and started a process ({seen[0]}): "
                    "mark it @pytest.mark.slow",
                    pytrace=False,
                )
