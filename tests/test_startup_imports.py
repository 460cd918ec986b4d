"""Start-up stays light: heavy modules are imported where they are first needed.

`navi run` must reach the LLM within 300 ms (issue 11), and most of that is imports.
Each check runs in a fresh interpreter (this one has imported everything already) and
lists which of the heavy modules an import pulled in:

- numpy (~50 ms): sqlite-utils imports it when installed (navi_trio/imports.py);
  llama-cpp-python needs it, on use only;
- rich, pygments: httpx's command-line client pulls them (the chat client uses rich);
- tiktoken: the cl100k encoding loads in a worker thread after the first request;
- mcp: the MCP client library, only when an MCP server is configured;
- trio_websocket: `navi run` loads it (and the server) when it runs, beside the threads
  building its HTTP client, not when its module is imported;
- sqlite_utils (with click, pluggy, dateutil): it makes the database's tables, so it
  loads when there is something to make, not for a run on a current database;
- the browser page's files and importlib.resources' reader: read at the first request
  for a page; difflib: imported with the first diff;
- importlib.metadata: trio-websocket's one question to it answered by trio;
- `ldconfig -p`, which trio's import runs to find libpthread: answered on glibc.

The garbage collector runs less often while `navi` starts (navi_trio/imports.py): its
start-up threshold holds from the command's start (before the cli's own imports) until a
runtime has frozen start-up's objects, and not beyond the command.

Code generated at start-up costs its compiling: a valid config is structured by cattrs'
plain code, the detailed code only generated for a file with a mistake to report; the
patterns that read a model's plan compile when the first plan is read; `navi run` and
the other commands of cli/__init__.py build their own subcommand's parser alone.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from navi_trio.imports import (
    START_UP_GC_THRESHOLD,
    import_standing_in,
    start_up_collections,
    start_up_over,
)

if TYPE_CHECKING:
    from navi_trio.settings import Settings

pytestmark = pytest.mark.slow  # its tests start processes

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "rich", "pygments", "tiktoken", "mcp")
TIMEOUT = 60


def imported_by(statement: str, names: tuple[str, ...]) -> list[str]:
    """Which of `names` are in sys.modules after `statement`, in a fresh interpreter."""
    code = f"import json, sys\n{statement}\nprint(json.dumps([n for n in {names!r} "
    code += "if n in sys.modules]))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def compiled_in(statement: str, module: str) -> list[str]:
    """The regexes `module`'s own code compiled during `statement`, in a fresh interpreter."""
    code = (
        "import json, re, sys\nseen = []\nreal = re._compile\n"
        "def spy(pattern, flags):\n"
        "    frame = sys._getframe(1)\n"  # the caller, past re and navi_trio.patterns
        "    while frame.f_globals.get('__name__') in ('re', 'navi_trio.patterns'):\n"
        "        frame = frame.f_back\n"
        "    if frame.f_globals.get('__name__') == MODULE:\n"
        "        seen.append(str(pattern))\n"
        "    return real(pattern, flags)\n"
        f"re._compile = spy\nMODULE = {module!r}\n{statement}\nprint(json.dumps(seen))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    seen: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def test_the_navi_command_imports_no_heavy_module() -> None:
    assert imported_by("import navi_trio.cli", HEAVY) == []


def test_the_embedded_run_path_imports_no_heavy_module() -> None:
    # What `navi run` imports before it starts its threads (cli_run.serve_run).
    statement = "import navi_trio.cli, navi_trio.cli.run, navi_trio.runtime"
    assert imported_by(statement, (*HEAVY, "trio_websocket")) == []


def test_the_store_and_core_are_imported_while_the_http_client_builds() -> None:
    # cmd_run reads the settings and the token file first; the store and the agent
    # come with the runtime, imported while threads build the HTTP client and probe bwrap.
    statement = "import navi_trio.cli, navi_trio.cli.run, navi_trio.api.auth"
    late = ("sqlite_utils", "navi_trio.store", "navi_trio.core.turn.agent", "navi_trio.runtime")
    assert imported_by(statement, late) == []


async def test_navi_run_on_a_current_database_leaves_sqlite_utils_out(tmp_path: Path) -> None:
    # sqlite-utils (with click, pluggy and dateutil) makes the tables: the first `navi run`
    # on a machine loads it to make the database, a later one only reads its schema.
    code = (
        "import json, sys\nfrom navi_trio.cli import main\ncode = main(['run', 'hi'])\n"
        "print(json.dumps([code, *(n in sys.modules for n in ('sqlite_utils', 'click', 'numpy'))]))"
    )
    seen = await _runs_of(code, tmp_path, ["made", "read"])
    # numpy stays out either way: sqlite-utils imports it when installed (imports.py).
    assert seen == [("made", [0, True, True, False]), ("read", [0, False, False, False])]


async def test_navi_run_reads_no_page_file_and_makes_no_diff(tmp_path: Path) -> None:
    # Its private server reads the browser page's files at the first request for one
    # (none in a run), the shipped folders are found without importlib.resources'
    # reader (`importlib.readers`, which reading the page's files imports), and difflib
    # comes with the first diff.
    code = (
        "import json, sys\nfrom navi_trio.cli import main\ncode = main(['run', 'hi'])\n"
        "print(json.dumps([code, *(n in sys.modules for n in ('importlib.readers', 'difflib'))]))"
    )
    assert await _runs_of(code, tmp_path, ["hello"]) == [("hello", [0, False, False])]


async def test_navi_run_leaves_importlib_metadata_out(tmp_path: Path) -> None:
    # trio-websocket's one question to it is answered by trio (api/_trio_websocket.py).
    code = (
        "import json, sys\nfrom navi_trio.cli import main\ncode = main(['run', 'hi'])\n"
        "print(json.dumps([code, 'trio_websocket' in sys.modules, "
        "'importlib.metadata' in sys.modules]))"
    )
    assert await _runs_of(code, tmp_path, ["hello"]) == [("hello", [0, True, False])]


async def _runs_of(code: str, tmp_path: Path, answers: list[str]) -> list[tuple[str, Any]]:
    """`code` run in a fresh interpreter once per answer of the fake LLM, all on one
    database in `tmp_path`: each run's first line of output and its last (JSON)."""
    from navi_trio.testing.fake_llm import open_fake_llm

    seen = []
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": text} for text in answers]) as llm:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("NAVI_", "OLLAMA_"))}
            env.update(OLLAMA_HOST=llm.url, NAVI_LLM_BACKEND="ollama")
            env.update(NAVI_DB=str(tmp_path / "navi.db"), NAVI_DATA_DIR=str(tmp_path / "data"))
            for _ in answers:
                done = await trio.run_process(
                    [sys.executable, "-c", code], env=env, cwd=tmp_path,
                    capture_stdout=True, capture_stderr=True, check=False,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr.decode()
                lines = done.stdout.decode().splitlines()
                seen.append((lines[0], json.loads(lines[-1])))
    return seen


async def test_navi_run_collects_no_garbage_before_its_runtime_freezes_start_up(
    tmp_path: Path,
) -> None:
    # Each pass over start-up's young objects costs a few ms and frees little: from the
    # start-up block's opening to the runtime's freeze there is none. The block opens
    # before attrs is imported (the module holding it imports only the standard library).
    assert imported_by("import navi_trio.imports", ("attrs", "attr")) == []
    code = (
        "import gc, json, sys\nseen = []\nfound = gc.get_threshold()\n"
        "def spy(phase, info):\n"  # in the block (its threshold) and before the freeze
        "    if phase == 'start' and gc.get_threshold() != found and not gc.get_freeze_count():\n"
        "        seen.append(info['generation'])\n"
        "gc.callbacks.append(spy)\nsys.argv = ['navi', 'run', 'hi']\n"
        "from navi_trio.__main__ import main\ncode = main()\n"
        "print(json.dumps([code, gc.get_freeze_count() > 0, seen]))"
    )
    assert await _runs_of(code, tmp_path, ["hello"]) == [("hello", [0, True, []])]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ldconfig: Linux only")
async def test_navi_run_runs_no_ldconfig_and_trio_still_names_its_threads(
    tmp_path: Path,
) -> None:
    # trio asks ctypes.util.find_library("pthread") at import, which runs `ldconfig -p`;
    # on glibc the `navi` command answers it with glibc's soname (navi_trio/imports.py).
    # The answer works: trio's worker threads still carry their names.
    import ctypes.util

    from navi_trio.imports import GLIBC_PTHREAD, _glibc

    if not _glibc():
        pytest.skip("not glibc: find_library is asked as it is")
    assert ctypes.util.find_library("pthread") == GLIBC_PTHREAD  # what ldconfig answers here
    code = (
        "import json, os, sys, ctypes.util\nran = []\nreal = ctypes.util.find_library\n"
        "def spy(event, args):\n"
        "    if event == 'subprocess.Popen':\n"
        "        ran.append(os.path.basename(os.fsdecode(args[0])))\n"
        "sys.addaudithook(spy)\nsys.argv = ['navi', 'run', 'hi']\n"
        "from navi_trio.__main__ import main\ncode = main()\nimport trio\n"
        "def comm():\n    return open('/proc/thread-self/comm').read().strip()\n"
        "name = trio.run(trio.to_thread.run_sync, comm)\n"  # the OS's name of a worker
        "print(json.dumps([code, 'ldconfig' in ran, ctypes.util.find_library is real,\n"
        "                  name != comm()]))"
    )
    assert await _runs_of(code, tmp_path, ["hello"]) == [("hello", [0, False, True, True])]


def test_find_library_answers_pthread_only_while_trio_imports() -> None:
    statement = (
        "import ctypes.util\nreal = ctypes.util.find_library\nasked = []\n"
        "ctypes.util.find_library = lambda name: asked.append(name) or real(name)\n"
        "spy = ctypes.util.find_library\n"
        "from navi_trio.imports import import_answering_pthread\n"
        "import_answering_pthread('trio')\n"
        "from navi_trio.imports import _glibc\n"
        "assert asked == ([] if _glibc() else ['pthread']), asked\n"
        "assert ctypes.util.find_library is spy\n"
        "ctypes.util.find_library('c')\nassert asked[-1:] == ['c'], asked"
    )
    assert imported_by(statement, ("trio",)) == ["trio"]


def test_find_library_answers_other_names_truly_while_the_module_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only "pthread" is answered without asking: a name asked by the module imported
    (here both, at its import) gets the real answer (stood in for: no ldconfig run)."""
    import ctypes.util

    from navi_trio.imports import GLIBC_PTHREAD, _glibc, import_answering_pthread

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: f"real {name}")
    (tmp_path / "asks_libraries.py").write_text(
        "import ctypes.util\nANSWERS = {n: ctypes.util.find_library(n) for n in ('pthread', 'c')}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "asks_libraries", raising=False)
    module = import_answering_pthread("asks_libraries")
    monkeypatch.delitem(sys.modules, "asks_libraries")
    pthread = GLIBC_PTHREAD if sys.platform.startswith("linux") and _glibc() else "real pthread"
    assert module.ANSWERS == {"pthread": pthread, "c": "real c"}


def test_a_module_hidden_from_sqlite_utils_is_importable_afterwards() -> None:
    # The local backend (llama-cpp-python) needs numpy after the store has loaded.
    pytest.importorskip("numpy")
    statement = "import navi_trio.store._sqlite_utils, numpy"
    assert imported_by(statement, ("numpy", "sqlite_utils")) == ["numpy", "sqlite_utils"]


def test_trio_websocket_is_imported_with_trios_own_version() -> None:
    # It asks importlib.metadata for trio's version at import: trio.__version__ answers
    # (the same), and importlib.metadata is the real one for whoever imports it later.
    statement = (
        "import navi_trio.api._trio_websocket, trio, trio_websocket._impl as impl\n"
        "assert impl._IS_TRIO_MULTI_ERROR is False and 'importlib.metadata' not in sys.modules\n"
        "import importlib.metadata\n"
        "assert importlib.metadata.version('trio') == trio.__version__"
    )
    assert imported_by(statement, ("trio_websocket", "importlib.metadata")) == [
        "trio_websocket",
        "importlib.metadata",
    ]


@pytest.mark.parametrize(
    "source",
    [
        "from importlib.metadata import distribution\nNAME = distribution('trio').name\n",
        # (a name asked of the module, not imported from it: an AttributeError)
        "import importlib.metadata as md\nNAME = md.distribution('trio').name\n",
    ],
    ids=["imported", "asked"],
)
def test_a_stand_in_that_does_not_serve_gives_way_to_the_real_module(
    tmp_path: Path, source: str
) -> None:
    (tmp_path / "wants_more.py").write_text(source)
    statement = (
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from navi_trio.imports import import_standing_in\n"
        "module = import_standing_in('wants_more', 'importlib.metadata', version=str)\n"
        "assert module.NAME == 'trio', module.NAME"
    )
    assert imported_by(statement, ("wants_more", "importlib.metadata")) == [
        "wants_more",
        "importlib.metadata",
    ]


def test_a_module_imported_already_is_not_stood_in_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in is only for a module not imported yet: one that is stays itself, for
    the importer and for everyone after."""
    (tmp_path / "uses_target.py").write_text("import standin_target\nKIND = standin_target.KIND\n")
    real = ModuleType("standin_target")
    real.KIND = "real"  # type: ignore[attr-defined]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "standin_target", real)
    try:
        module = import_standing_in("uses_target", "standin_target", KIND="stand-in")
        assert module.KIND == "real"
        assert sys.modules["standin_target"] is real
    finally:
        sys.modules.pop("uses_target", None)


def test_httpx_works_without_its_command_line_client() -> None:
    statement = "import navi_trio.llm, httpx; assert httpx.AsyncClient and httpx.Timeout"
    assert imported_by(statement, ("httpx", "httpx._main", "click")) == ["httpx"]


async def test_the_client_built_in_a_thread_is_handed_over() -> None:
    from navi_trio.cli.common import InThread
    from navi_trio.llm.factory import make_client
    from navi_trio.settings import Settings

    building = InThread(make_client, Settings.from_env({}, llm_connect_timeout=3.5))
    with trio.fail_after(TIMEOUT):
        client = await building.result()
        async with client:
            assert client.timeout.connect == 3.5 and client.timeout.read is None
            assert await building.result() is client


async def test_a_failure_in_the_thread_is_raised_in_the_caller() -> None:
    from navi_trio.cli.common import InThread

    def broken() -> None:
        raise ValueError("no certificates here")

    with trio.fail_after(TIMEOUT), pytest.raises(ValueError, match="no certificates here"):
        await InThread(broken).result()


async def test_navi_run_builds_its_http_client_in_a_thread_and_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from navi_trio.cli import run as cli_run
    from navi_trio.llm.factory import make_client as real

    on_main_thread: list[bool] = []

    def recording(settings: Settings) -> httpx.AsyncClient:
        on_main_thread.append(threading.current_thread() is threading.main_thread())
        return real(settings)

    monkeypatch.setattr(cli_run, "make_client", recording)
    assert await _run_embedded_hi(tmp_path) == "hello\n"
    assert on_main_thread == [False], "the client was not built by run_embedded's thread"


async def _run_embedded_hi(tmp_path: Path) -> str:
    """`navi run hi` in a private daemon of this process (the fake LLM answering
    "hello"), as `cmd_run` runs it; what it printed. The run must complete."""
    from navi_trio.cli import run as cli_run
    from navi_trio.cli.common import config_source
    from navi_trio.cli.runner import RunRequest
    from navi_trio.settings import Settings
    from navi_trio.testing.fake_llm import open_fake_llm

    out, err = io.StringIO(), io.StringIO()
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "hello"}]) as llm:
            # The data folder apart from the working one: a daemon, private or not,
            # never takes its own data for a workspace.
            settings = Settings.from_env(
                {}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data",
                llm_url=llm.url, llm_backend="ollama",
            )  # fmt: skip
            req = RunRequest("s-start", "hi", tmp_path, None, False)
            source = config_source(settings)
            outcome = await cli_run.run_embedded(settings, source, req, out, err)
    assert outcome.end is not None and outcome.end.reason == "complete", err.getvalue()
    return out.getvalue()


async def test_navi_run_probes_the_sandbox_once_as_its_runtime_checks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The thread's probe asks what the runtime's check asks (as root: as the tool user),
    # so the runtime finds the answer cached instead of waiting for a probe of its own.
    import functools

    from navi_trio import runtime
    from navi_trio.cli import run as cli_run
    from navi_trio.tools import sandbox
    from navi_trio.tools.runas import RunAs

    probed: list[tuple[Path | None, RunAs | None]] = []

    @functools.lru_cache(maxsize=8)
    def probe(bwrap: Path | None, user: RunAs | None = None) -> tuple[bool, str]:
        probed.append((bwrap, user))
        return True, "bwrap works"

    tool_user = RunAs(54321, 54321, "tools")  # whom a root navi runs its tools as
    monkeypatch.setattr(sandbox, "_probe", probe)
    monkeypatch.setattr(runtime, "run_as", lambda setting: tool_user)
    monkeypatch.setattr(cli_run, "run_as", lambda setting: tool_user, raising=False)
    assert await _run_embedded_hi(tmp_path) == "hello\n"
    assert probed == [(sandbox.find_bwrap(None), tool_user)]


def test_the_acp_agent_and_its_sdk_stay_out_of_every_other_command() -> None:
    # `navi acp` alone imports the ACP SDK's pydantic models (navi_trio/acp/).
    statement = "import navi_trio.cli, navi_trio.cli.run, navi_trio.runtime"
    assert imported_by(statement, ("navi_trio.acp", "acp", "pydantic")) == []


def test_the_acp_packages_lines_and_texts_load_without_its_sdk() -> None:
    # The package's __init__ imports nothing: the JSON-RPC lines and the update texts
    # (what the everyday tests import) need neither pydantic nor the ACP SDK.
    statement = "import navi_trio.acp, navi_trio.acp.updates, navi_trio.acp.jsonrpc"
    assert imported_by(statement, ("acp", "pydantic")) == []


def test_metrics_stay_out_of_navi_run_and_its_private_daemon() -> None:
    # prometheus_client comes with `navi serve`'s DaemonMetrics (api/metrics.py) only: a
    # private daemon's server and page (serve_privately) never load it.
    statement = (
        "import navi_trio.cli, navi_trio.cli.run, navi_trio.runtime, navi_trio.cli.serve, "
        "navi_trio.api.server, navi_trio.api.web, navi_trio.api.health"
    )
    assert imported_by(statement, ("prometheus_client", "navi_trio.api.metrics")) == []


def test_the_opentelemetry_sdk_loads_only_when_tracing_is_configured() -> None:
    # `navi serve` asks open_tracing at start: without the variables it is None, and no
    # module of the SDK (nor the traces observer) is loaded.
    statement = (
        "import navi_trio.cli, navi_trio.cli.run, navi_trio.runtime, navi_trio.cli.serve\n"
        "from navi_trio.api.tracing import open_tracing\n"
        "assert open_tracing({'NAVI_OTEL_CONTENT': '1'}) is None"
    )
    assert imported_by(statement, ("opentelemetry", "navi_trio.api.traces")) == []
    configured = statement.replace(
        "open_tracing({'NAVI_OTEL_CONTENT': '1'}) is None",
        "open_tracing({'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:9'}) is not None",
    )
    assert imported_by(configured, ("opentelemetry", "navi_trio.api.traces")) == [
        "opentelemetry", "navi_trio.api.traces",
    ]  # fmt: skip


def test_tracing_asked_for_without_the_sdk_is_one_error_naming_the_extra() -> None:
    code = (
        "import sys\nsys.modules['opentelemetry'] = None\n"
        "from navi_trio.api.tracing import open_tracing\n"
        "open_tracing({'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:9'})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("navi_trio.errors.ConfigError: OTEL_EXPORTER_OTLP_ENDPOINT is set")
    assert "navi-trio[otel]" in last


def test_the_navi_command_starts_with_fewer_collections_and_ends_as_it_found_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from navi_trio import cli

    seen: list[tuple[int, int, int]] = []

    def status(args: argparse.Namespace, out: object, err: object) -> int:
        seen.append(gc.get_threshold())
        return 0

    monkeypatch.setitem(cli._COMMANDS, "status", status)
    before = gc.get_threshold()
    assert before[0] != START_UP_GC_THRESHOLD
    assert cli.main(["status"]) == 0
    assert seen == [(START_UP_GC_THRESHOLD, *before[1:])]
    assert gc.get_threshold() == before


def test_the_console_script_imports_the_cli_under_the_start_up_threshold() -> None:
    # `python -m navi_trio` and the `navi` script (pyproject's entry point) alike.
    code = (
        "import gc, importlib.abc, json, sys\nseen = []\n"
        "class Spy(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'navi_trio.cli':\n"
        "            seen.append(gc.get_threshold())\n"
        "sys.meta_path.insert(0, Spy())\nbefore = gc.get_threshold()\n"
        "sys.argv = ['navi', 'status', '--url', 'ws://127.0.0.1:9']\n"
        "from navi_trio.__main__ import main\ncode = main()\n"
        "print(json.dumps([code, seen, before, gc.get_threshold()]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
    )
    code_, seen, before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == [[START_UP_GC_THRESHOLD, *before[1:]]] and after == before
    assert code_ == 1 and "navi: error:" in done.stderr  # no daemon there: it ran, and said so
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert scripts["project"]["scripts"]["navi"] == "navi_trio.__main__:main"


def _settings_without_llm(tmp_path: Path) -> Settings:
    """A runtime's settings in `tmp_path`, its LLM nowhere (no request is made)."""
    from navi_trio.settings import Settings

    return Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data", llm_url="http://127.0.0.1:9"
    )


async def test_a_runtime_ends_the_start_up_collections_once_it_has_frozen_start_up(
    tmp_path: Path,
) -> None:
    from navi_trio.runtime import open_runtime

    before = gc.get_threshold()
    settings = _settings_without_llm(tmp_path)
    with start_up_collections(), trio.fail_after(TIMEOUT):
        with start_up_collections():  # an inner block leaves the start-up to the outer one
            assert gc.get_threshold()[0] == START_UP_GC_THRESHOLD
        assert gc.get_threshold()[0] == START_UP_GC_THRESHOLD
        async with open_runtime(settings):
            assert gc.get_threshold() == before
        assert gc.get_threshold() == before
    assert gc.get_threshold() == before


async def test_a_client_ends_the_start_up_collections_once_it_is_connected(
    tmp_path: Path,
) -> None:
    # A command that opens no runtime (a client of a daemon) may run for hours: its
    # young collections come back with its connection, not at its end.
    from navi_trio.api.daemon_client import open_daemon
    from navi_trio.cli.common import config_source
    from navi_trio.cli.serve import serve_privately

    before = gc.get_threshold()
    settings = _settings_without_llm(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with serve_privately(settings, config_source(settings)) as daemon:
            with start_up_collections():
                assert gc.get_threshold()[0] == START_UP_GC_THRESHOLD
                async with open_daemon(daemon.url, daemon.token, own_listener=True):
                    assert gc.get_threshold() == before
            assert gc.get_threshold() == before


@pytest.mark.parametrize("own", [(1000, 10, 10), (START_UP_GC_THRESHOLD, 10, 10)])
def test_the_start_up_collections_put_back_the_thresholds_they_found(
    own: tuple[int, int, int],
) -> None:
    """A process's own thresholds come back after `start_up_over` and after the block,
    even its own young threshold of the start-up's (not taken for an open block)."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(*own)
        start_up_over()  # no block open: nothing to end
        assert gc.get_threshold() == own
        with start_up_collections():
            assert gc.get_threshold() == (START_UP_GC_THRESHOLD, *own[1:])
            start_up_over()
            assert gc.get_threshold() == own
            gc.set_threshold(3000, 10, 10)  # set after start-up: the process's own
            start_up_over()  # once only
            assert gc.get_threshold() == (3000, 10, 10)
        assert gc.get_threshold() == (3000, 10, 10)
        gc.set_threshold(*own)
        with start_up_collections():
            assert gc.get_threshold() == (START_UP_GC_THRESHOLD, *own[1:])
        assert gc.get_threshold() == own  # ended by the block alone
    finally:
        gc.set_threshold(*before)


def test_a_valid_config_is_structured_without_the_detailed_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cattrs

    from navi_trio.errors import ConfigError
    from navi_trio.profiles import NaviConfig, _load, parse_config

    detailed: list[object] = []
    real = cattrs.Converter.structure

    def recording(self: cattrs.Converter, obj: object, cl: type[object]) -> object:
        if self is _load._converter:
            detailed.append(cl)
        return real(self, obj, cl)

    monkeypatch.setattr(cattrs.Converter, "structure", recording)
    path = REPO / "config" / "config.json"
    cfg = parse_config(json.loads(path.read_text(encoding="utf-8")), path)
    assert cfg.profiles and detailed == []
    bad = json.loads(path.read_text(encoding="utf-8"))
    first = next(iter(bad["profiles"]))
    bad["profiles"][first]["max_iterations"] = "5"
    where = rf"\$\.profiles\['{first}'\]\.max_iterations"
    expected = rf"expected int \(a whole number\), got '5' @ {where}"
    with pytest.raises(ConfigError, match=expected):
        parse_config(bad, path)
    assert detailed == [NaviConfig]  # the mistake is worded by the detailed converter


def test_the_plan_readers_patterns_compile_on_first_use() -> None:
    module = "navi_trio.core.turn.plan_text"
    assert compiled_in("import navi_trio.core.turn", module) == []
    reading = "from navi_trio.core.turn import parse_analysis\nparse_analysis('Reflect: yes')"
    assert len(compiled_in(reading, module)) >= 2  # the spy sees this module's patterns


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_a_command_of_the_cli_module_is_parsed_by_its_own_parser_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from navi_trio import cli

    built: list[list[str]] = []
    real = cli.build_parser

    def recording(command: str | None = None) -> argparse.ArgumentParser:
        parser = real(command)
        built.append(_subcommands(parser))
        return parser

    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace, out: object, err: object) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(cli, "build_parser", recording)
    monkeypatch.setitem(cli._COMMANDS, "run", run)
    assert cli.main(["run", "--session", "s-1", "hi"]) == 0
    assert built == [["run"]] and seen[0].message == "hi" and seen[0].session == "s-1"
    assert cli.main(["runn", "hi"]) == 1  # a wrong name: the whole parser says which exist
    assert len(built[-1]) > 10 and "run" in built[-1]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--events", "--mode", "full", "--on-busy", "steer", "--local", "-"],
        ["doctor", "--json", "--cwd", "/x"],
        ["compact", "--session", "s-1", "--url", "ws://127.0.0.1:1"],
        ["chat", "--profile", "p"],
        ["web", "--token", "t"],
    ],
)
def test_a_commands_own_parser_reads_and_helps_as_the_whole_one(argv: list[str]) -> None:
    from navi_trio.cli import build_parser

    alone, whole = build_parser(argv[0]), build_parser()
    assert _subcommands(alone) == [argv[0]]
    assert vars(alone.parse_args(argv)) == vars(whole.parse_args(argv))
    helps = []
    for parser in (alone, whole):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            parser.parse_args([argv[0], "--help"])
        helps.append(out.getvalue())
    assert helps[0] == helps[1] and helps[0].startswith(f"usage: navi {argv[0]} ")
