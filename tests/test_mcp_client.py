"""Tools from MCP servers (issue 13, client): real servers written with the SDK's
MCPServer (tests/mcp_servers/demo.py), over stdio (a child python) and over streamable
HTTP (uvicorn in a child process on a free 127.0.0.1 port), driven through real agent
runs against the fake LLM server.

Rules: loopback only; every I/O test has an absolute timeout; no test sleeps. What the
server does (a call started, a call cancelled) reaches the test as ``EVENT`` lines on
the server's stderr: through navi's log for a stdio server (which also proves that its
stderr goes to the log), from the child's pipe for the HTTP one.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import of_type
from realtime import real_time_limit

from navi_trio.errors import ConfigError
from navi_trio.profiles import ConfigSource, parse_config
from navi_trio.settings import Settings, default_config_path
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext
from navi_trio.tools.mcp import McpServers, connection
from navi_trio.tools.mcp.schema import check_schema

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 60
STALL = 30  # real seconds of nothing to do before a mock clock moves on its own
DEMO = Path(__file__).parent / "mcp_servers" / "demo.py"
PLAIN = Path(__file__).parent / "mcp_servers" / "plain.py"
ALLOW = {"rules": [{"tool": "mcp__demo__*", "decision": "allow"}]}


class ServerEvents:
    """The ``EVENT`` lines a demo server wrote, and a way to wait for one."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = trio.Event()

    def add(self, line: str) -> None:
        if "EVENT " in line:
            self.lines.append(line.split("EVENT ", 1)[1].strip())
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, text: str) -> None:
        while text not in self.lines:
            await self._changed.wait()


class _ToEvents(logging.Handler):
    def __init__(self, events: ServerEvents) -> None:
        super().__init__(logging.INFO)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        self.events.add(record.getMessage())


@pytest.fixture(autouse=True)
def quick_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart waits 0.01 s, not 0.5: these tests see that a server comes back, and
    the backoff's own rule is checked on a MockClock (test_mcp_failures.py)."""
    monkeypatch.setattr(connection, "BACKOFF_FIRST", 0.01)


@pytest.fixture
def events() -> Iterator[ServerEvents]:
    """The stdio server's stderr, as navi logs it."""
    got = ServerEvents()
    logger = logging.getLogger("navi_trio.mcp.stderr")
    handler, old = _ToEvents(got), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(old)


def stdio_entry(**extra: Any) -> dict[str, Any]:
    """The SDK's demo server over stdio (`extra`: more of the entry; env values as text)."""
    return _entry([str(DEMO)], extra)


def plain_entry(**extra: Any) -> dict[str, Any]:
    """The hand-written stand-in with the demo's tools, for tests about navi's side."""
    return _entry(["-S", str(PLAIN)], extra)


def _entry(args: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    env = {k: str(v) for k, v in extra.pop("env", {}).items()}
    return {"command": sys.executable, "args": args, "env": env, **extra}


@asynccontextmanager
async def http_server(events: ServerEvents, port: int = 0, **env: Any) -> AsyncIterator[str]:
    """The demo server over streamable HTTP in a child process; yields its URL."""
    async with trio.open_nursery() as nursery:
        proc = await trio.lowlevel.open_process(
            [sys.executable, str(DEMO), "--http", "--port", str(port)],
            env={**os.environ, **{k: str(v) for k, v in env.items()}},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        nursery.start_soon(_feed, proc.stderr, events)
        first = b""
        while b"\n" not in first:
            chunk = await proc.stdout.receive_some(100)
            assert chunk, "the HTTP server exited before it listened"
            first += chunk
        port = int(first.split()[1])
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
            nursery.cancel_scope.cancel()


async def _feed(stderr: trio.abc.ReceiveStream, events: ServerEvents) -> None:
    """A server's stderr, line by line, into `events`."""
    buffer = b""
    async for chunk in stderr:
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            events.add(line.decode(errors="replace"))


class SharedHttpDemo:
    """One demo server over HTTP for the tests that only call it (one per module and
    worker; a fresh one if it died). Sharing is safe: the server keeps no state between
    calls, each run opens its own MCP session, and the EVENT labels the tests wait for
    differ from test to test, so a line left from the test before matches nothing."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def ready(self) -> SharedHttpDemo:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.proc = subprocess.Popen(
                [sys.executable, str(DEMO), "--http"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert self.proc.stdout is not None
            with selectors.DefaultSelector() as sel:
                sel.register(self.proc.stdout, selectors.EVENT_READ)
                assert sel.select(TIMEOUT), "the HTTP server did not listen in time"
            first = self.proc.stdout.readline()
            assert first.startswith(b"PORT "), "the HTTP server exited before it listened"
            self.url = f"http://127.0.0.1:{int(first.split()[1])}/mcp"
        return self

    @asynccontextmanager
    async def feeding(self, events: ServerEvents) -> AsyncIterator[str]:
        """The URL, with the server's stderr going to `events` meanwhile."""
        assert self.proc is not None and self.proc.stderr is not None
        stderr = trio.lowlevel.FdStream(os.dup(self.proc.stderr.fileno()))
        async with stderr, trio.open_nursery() as nursery:
            nursery.start_soon(_feed, stderr, events)
            try:
                yield self.url
            finally:
                nursery.cancel_scope.cancel()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()


@pytest.fixture(scope="module")
def shared_http_demo() -> Iterator[SharedHttpDemo]:
    demo = SharedHttpDemo()
    yield demo
    demo.stop()


@pytest.fixture
def http_demo(transport: str, request: pytest.FixtureRequest) -> SharedHttpDemo | None:
    """The module's shared HTTP demo server for a test over HTTP; None over stdio."""
    if transport != "http":
        return None
    shared: SharedHttpDemo = request.getfixturevalue("shared_http_demo")
    return shared.ready()


def mcp_config(servers: dict[str, Any], **profile: Any) -> ConfigSource:
    """The shipped config with `servers` and the general profile using them (no other
    tools, no plan, calls allowed unless `policy` says otherwise)."""
    path = default_config_path()
    data = with_servers(json.loads(path.read_text(encoding="utf-8")), servers, **profile)
    return ConfigSource(path, initial=parse_config(data, path))


def with_servers(data: dict[str, Any], servers: dict[str, Any], **profile: Any) -> dict[str, Any]:
    """Config `data` with `servers`, the general profile using them as `mcp_config` says."""
    data["mcp_servers"] = servers
    changes = {
        "tools": {"agent": [], "subagent": []},
        "mcp_servers": list(servers),
        "planning_first_message": False,
        "think_enabled": False,
        "policy": ALLOW,
        **profile,
    }
    data["profiles"]["general"] = {**data["profiles"]["general"], **changes}
    return data


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


@asynccontextmanager
async def demo_servers(
    http: SharedHttpDemo | None, events: ServerEvents, **entry: Any
) -> AsyncIterator[dict[str, Any]]:
    """The `mcp_servers` config naming the demo server as "demo": the shared one over
    HTTP when `http` is given, else a child over stdio."""
    if http is None:
        yield {"demo": stdio_entry(**entry)}
    else:
        async with http.feeding(events) as url:
            yield {"demo": {"url": url, **entry}}


def results(frames: list[dict[str, Any]]) -> list[tuple[bool, str]]:
    return [(r["ok"], r["output"] or r["error"]) for r in of_type(frames, "tool_result")]


# -- laziness and config ---------------------------------------------------------------


def test_importing_the_runtime_and_cli_does_not_load_the_sdk() -> None:
    code = (
        "import sys, navi_trio.runtime, navi_trio.cli, navi_trio.cli.mcp, navi_trio.cli.doctor; "
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'mcp_'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("servers", "profile", "words"),
    [
        ({"fs": {"command": "x", "url": "http://h/mcp"}}, ["fs"], "exactly one of command"),
        ({"fs": {}}, ["fs"], "exactly one of command"),
        ({"fs": {"url": "ftp://h"}}, ["fs"], "mcp_servers['fs'].url"),
        ({"fs": {"command": "x", "tools": "read"}}, ["fs"], "mcp_servers['fs'].tools"),
        ({"fs": {"command": "x", "timeout_sec": 0}}, ["fs"], "timeout_sec"),
        ({"f__s": {"command": "x"}}, [], "server name"),
        ({"fs": {"command": "x"}}, ["nope"], "profiles['general'].mcp_servers: unknown MCP"),
        ({"fs": {"command": "x", "colour": 1}}, ["fs"], "colour"),
    ],
)
def test_a_bad_mcp_entry_names_the_file_and_key(
    servers: dict[str, Any], profile: list[str], words: str
) -> None:
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["mcp_servers"] = servers
    data["profiles"]["general"]["mcp_servers"] = profile
    with pytest.raises(ConfigError) as err:
        parse_config(data, path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_a_policy_rule_may_name_mcp_tools_of_a_configured_server() -> None:
    from navi_trio.profiles import check_config

    path = default_config_path()
    for tool, ok in (("mcp__demo__*", True), ("mcp__*", True), ("mcp__other__x", False)):
        cfg = mcp_config(
            {"demo": stdio_entry()}, policy={"rules": [{"tool": tool, "decision": "allow"}]}
        ).current
        if ok:
            check_config(cfg, path)
        else:
            with pytest.raises(ConfigError, match="names no configured MCP server"):
                check_config(cfg, path)


# -- through agent runs ------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_list_and_call_through_a_run(
    tmp_path: Path, transport: str, events: ServerEvents, http_demo: SharedHttpDemo | None
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            demo_servers(http_demo, events) as servers,
            open_harness(
                tmp_path,
                replies=[call("mcp__demo__echo", text="hi"), {"text": "done"}],
                config=mcp_config(servers),
            ) as h,
        ):
            frames = await h.turn("s1", "say hi through the server")
            assert results(frames) == [(True, "echo: hi")]
            assert frames[-1]["text"] == "done"
            await events.wait_for("echo hi")
            offered = {t["function"]["name"]: t for t in h.chat_requests[0]["tools"]}
            assert {"mcp__demo__echo", "mcp__demo__hang", "mcp__demo__fail"} <= set(offered)
            params = offered["mcp__demo__echo"]["function"]["parameters"]
            assert params["type"] == "object" and params["required"] == ["text"]
            # The result reached the model as the tool message.
            sent = h.chat_requests[1]["messages"]
            assert [m["content"] for m in sent if m["role"] == "tool"] == ["echo: hi"]
            assert h.runtime.mcp.status()[0]["state"] == "ready"


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_tool_error_is_a_failed_result(
    tmp_path: Path, transport: str, events: ServerEvents, http_demo: SharedHttpDemo | None
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            demo_servers(http_demo, events) as servers,
            open_harness(
                tmp_path,
                replies=[call("mcp__demo__fail", reason="bad disk"), {"text": "it failed"}],
                config=mcp_config(servers),
            ) as h,
        ):
            frames = await h.turn("s1", "try it")
            [result] = of_type(frames, "tool_result")
            assert not result["ok"] and result["error"] == "demo fail failed"
            assert "failed on purpose: bad disk" in result["output"]
            tool_msg = [m for m in h.chat_requests[1]["messages"] if m["role"] == "tool"][0]
            assert "failed on purpose: bad disk" in tool_msg["content"]


async def test_a_long_output_is_capped_like_other_tools(
    tmp_path: Path, events: ServerEvents
) -> None:
    long = "word " * 200
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__echo", text=long), {"text": "read it"}],
            config=mcp_config({"demo": plain_entry()}),
            tool_output_max_chars=120,
        ) as h:
            frames = await h.turn("s1", "say a lot")
            [(ok, text)] = results(frames)
            assert ok and "characters cut" in text and len(text) < 200
            assert text.startswith("echo: word word")


async def test_non_text_content_comes_back_as_references(
    tmp_path: Path, events: ServerEvents
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__media"), {"text": "seen"}],
            config=mcp_config({"demo": plain_entry()}),
        ) as h:
            frames = await h.turn("s1", "show me")
            [(ok, text)] = results(frames)
            assert ok
            assert text.splitlines() == [
                "here is the media",
                "[image/png, 12 KB]",
                "[audio/wav, 40 B]",
                "[resource file:///tmp/notes.txt]",
                "the notes",
                "[resource file:///x/report.pdf (application/pdf)]",
            ]


async def test_allow_list_and_a_schema_too_large(tmp_path: Path, events: ServerEvents) -> None:
    entry = plain_entry(env={"DEMO_BIG_SCHEMA": 40_000}, tools=["echo", "huge", "missing"])
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__shout", text="x"), {"text": "ok"}],
            config=mcp_config({"demo": entry}),
        ) as h:
            frames = await h.turn("s1", "go")
            offered = {t["function"]["name"]: t for t in h.chat_requests[0]["tools"]}
            assert set(offered) == {"mcp__demo__echo", "mcp__demo__huge"}
            huge = offered["mcp__demo__huge"]["function"]["parameters"]
            assert huge == {
                "type": "object",
                "properties": {"value": {"type": "string"}},
                "required": ["value"],
            }
            warnings = [w["message"] for w in of_type(frames, "warning")]
            assert any("'huge'" in w and "cut to names and types" in w for w in warnings)
            assert any("missing" in w and "allow-list" in w for w in warnings)
            # A tool outside the allow-list is not callable either.
            [(ok, text)] = results(frames)
            assert not ok and "unknown tool 'mcp__demo__shout'" in text


def test_a_schema_whose_names_alone_are_too_large_becomes_an_open_object() -> None:
    # Names and types are all a cut schema keeps; when even they pass the bound, the
    # model is offered an open object rather than the server's bytes.
    props = {f"p{i:05d}_" + "n" * 40: {"type": "string"} for i in range(1000)}
    offered, warning = check_schema({"type": "object", "properties": props}, max_chars=16_000)
    assert offered == {"type": "object", "properties": {}, "additionalProperties": True}
    assert "cut to names and types" in warning
    small = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert check_schema(small, max_chars=16_000) == (small, "")


async def test_a_crashed_server_restarts_and_its_tools_say_so_meanwhile(
    tmp_path: Path, events: ServerEvents
) -> None:
    marker = tmp_path / "crashed-once"
    entry = plain_entry(env={"DEMO_CRASH_ONCE": marker})
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[
                call("mcp__demo__crash"),
                call("mcp__demo__echo", text="too soon"),
                {"text": "it crashed"},
                call("mcp__demo__crash"),
                {"text": "it survived"},
            ],
            config=mcp_config({"demo": entry}),
        ) as h:
            frames = await h.turn("s1", "crash it")
            [(ok1, crashed), (ok2, meanwhile)] = results(frames)
            assert not ok1 and "closed the connection during the call" in crashed
            assert not ok2 and "MCP server demo" in meanwhile and "restarting" in meanwhile
            await events.wait_for("crash")
            actor = h.runtime.mcp.connection("demo")
            assert actor is not None
            await actor.until("ready", starts=2)
            frames = await h.turn("s1", "again")
            assert results(frames) == [(True, "survived: this is the restarted server")]


async def test_a_server_killed_between_calls_is_noticed_and_restarted(
    tmp_path: Path, events: ServerEvents
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__spawn"), {"text": "pid"},
                     call("mcp__demo__echo", text="back"), {"text": "ok"}],
            config=mcp_config({"demo": plain_entry()}),
        ) as h:  # fmt: skip
            [(ok, out)] = results(await h.turn("s1", "your pid?"))
            server = json.loads(out)["server"]
            actor = h.runtime.mcp.connection("demo")
            assert actor is not None and actor.starts == 1
            os.kill(server, signal.SIGKILL)  # no call is running: the actor must see it
            await actor.until("ready", starts=2)
            assert results(await h.turn("s1", "again")) == [(True, "echo: back")]


async def test_an_http_server_that_crashed_is_reconnected_once_it_is_back(
    tmp_path: Path, events: ServerEvents
) -> None:
    with trio.fail_after(TIMEOUT):
        async with http_server(events) as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            async with open_harness(
                tmp_path,
                replies=[
                    call("mcp__demo__crash"),
                    call("mcp__demo__echo", text="too soon"),
                    {"text": "it crashed"},
                    call("mcp__demo__echo", text="back"),
                    {"text": "it is back"},
                ],
                config=mcp_config({"demo": {"url": url}}),
            ) as h:
                frames = await h.turn("s1", "crash it")
                [(ok1, crashed), (ok2, meanwhile)] = results(frames)
                assert not ok1 and "closed the connection during the call" in crashed
                assert not ok2 and "restarting" in meanwhile
                actor = h.runtime.mcp.connection("demo")
                assert actor is not None
                # The same URL answers again: the actor's next attempt connects.
                async with http_server(events, port=port):
                    actor.retry()  # in case it gave up while the server was down
                    await actor.until("ready", starts=2)
                    frames = await h.turn("s1", "again")
                    assert results(frames) == [(True, "echo: back")]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_stop_mid_call_cancels_the_request_on_the_server(
    tmp_path: Path, transport: str, events: ServerEvents, http_demo: SharedHttpDemo | None
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            demo_servers(http_demo, events) as servers,
            open_harness(
                tmp_path,
                replies=[call("mcp__demo__hang", label="s1"), {"text": "after"}],
                config=mcp_config(servers),
            ) as h,
        ):
            s = await h.session("s1")
            s.send("wait for it")
            await events.wait_for("hang-started s1")
            assert s.stop() is True
            frames = await s.until_end()
            assert (frames[-1]["stopped"], frames[-1]["reason"]) == (True, "stopped")
            assert results(frames) == [(False, "stopped by the user")]
            # The SDK told the server, which cancelled the tool's task.
            await events.wait_for("hang-cancelled s1")


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_call_past_timeout_sec_fails_and_the_server_is_told(
    tmp_path: Path,
    transport: str,
    events: ServerEvents,
    http_demo: SharedHttpDemo | None,
    mock_clock: trio.testing.MockClock,
) -> None:
    """The clock moves only after STALL real seconds with nothing to do (so the
    absolute timeout still guards each wait on real I/O), and at once while the call
    hangs: the 5 s timeout passes in no real time."""
    mock_clock.autojump_threshold = STALL
    async with demo_servers(http_demo, events, timeout_sec=5) as servers:
        await _time_out(tmp_path, servers, events, mock_clock)


async def _time_out(
    tmp_path: Path,
    servers: dict[str, Any],
    events: ServerEvents,
    mock_clock: trio.testing.MockClock,
) -> None:
    cfg = mcp_config(servers).current
    settings = Settings.from_env({}, db_path=tmp_path / "db", data_dir=tmp_path / "d")
    ctx = ToolContext(
        session_id="s", session_dir=tmp_path, kv=None,  # type: ignore[arg-type]
        settings=settings, profile=cfg.profile(None), config=cfg,
    )  # fmt: skip
    mcp = McpServers(lambda: cfg)
    got: list[Any] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        with trio.fail_after(TIMEOUT):
            await nursery.start(mcp.run)
            names = await mcp.prepare(cfg.profile(None), lambda _: None)
            assert "mcp__demo__hang" in names
            tool = mcp.get("mcp__demo__hang")
            assert tool is not None

            async def run_call() -> None:
                got.append(await tool.execute({"label": "t"}, ctx))
                done.set()

            nursery.start_soon(run_call)
            await events.wait_for("hang-started t")
            mock_clock.autojump_threshold = 0  # while the call waits: time flies
            await done.wait()
            mock_clock.autojump_threshold = STALL  # the cancel notice travels in real time
            await events.wait_for("hang-cancelled t")
        # The shutdown polls on the clock, and every wait in it is bounded: let it fly.
        mock_clock.autojump_threshold = 0
        nursery.cancel_scope.cancel()
    [result] = got
    assert not result.ok and "did not answer hang within 5 s" in result.error


async def test_an_mcp_call_asks_by_default_then_runs_or_is_denied(
    tmp_path: Path, events: ServerEvents
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[
                call("mcp__demo__echo", text="approved"), {"text": "ran"},
                call("mcp__demo__echo", text="denied"), {"text": "refused"},
            ],
            config=mcp_config({"demo": plain_entry()}, policy={}),
        ) as h:  # fmt: skip
            s = await h.session("s1")
            for approve, text in ((True, "approved"), (False, "denied")):
                s.send(f"echo {text}")
                [*_, request] = await s.until_type("approval_request")
                assert request["tool"] == "mcp__demo__echo"
                assert "MCP server" in request["rule"]
                await h.runtime.approvals.answer(
                    "s1", request["call_id"], approve=approve, scope="once", user_id="local"
                )
                frames = await s.until_end()
                [(ok, out)] = results(frames)
                if approve:
                    assert (ok, out) == (True, "echo: approved")
                else:
                    assert not ok and "the user denied it" in out
            assert events.lines.count("echo approved") == 1
            assert "echo denied" not in events.lines


async def test_a_server_with_background_true_offers_background_calls(
    tmp_path: Path, events: ServerEvents
) -> None:
    servers = {"demo": plain_entry(background=True), "fg": plain_entry()}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__echo", text="later", background=True), {"text": "queued"}],
            config=mcp_config(servers, policy={"rules": [{"tool": "mcp__*", "decision": "allow"}]}),
        ) as h:
            frames = await h.turn("s1", "in the background please")
            offered = {t["function"]["name"]: t["function"] for t in h.chat_requests[0]["tools"]}
            assert "background" in offered["mcp__demo__echo"]["parameters"]["properties"]
            assert "background" not in offered["mcp__fg__echo"]["parameters"]["properties"]
            [(ok, out)] = results(frames)
            task_id = json.loads(out)["task_id"]
            assert ok and task_id
            supervisor = h.runtime.supervisor
            assert await supervisor.wait("s1", task_id, TIMEOUT)
            job = supervisor.get("s1", task_id)
            assert job is not None and job.result is not None
            assert (job.result.ok, job.result.output) == (True, "echo: later")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def test_shutdown_kills_the_server_and_what_it_started(
    tmp_path: Path, events: ServerEvents
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__spawn"), {"text": "spawned"}],
            config=mcp_config({"demo": plain_entry()}),
        ) as h:
            frames = await h.turn("s1", "start something")
            [(ok, out)] = results(frames)
            assert ok
            pids = json.loads(out)
            assert _alive(pids["server"]) and _alive(pids["child"])
        # The runtime is closed: no orphan is left, not even one outside the group.
        assert not _alive(pids["server"])
        assert not _alive(pids["child"])


async def unavailable_warning(tmp_path: Path, servers: dict[str, Any]) -> str:
    """What a run says of `servers`, one of which cannot start: the run goes on without
    it, and warns once (``mcp_unavailable``); that warning's message."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[{"text": "fine without it"}], config=mcp_config(servers, policy={})
        ) as h:
            frames = await h.turn("s1", "hello")
    assert frames[-1]["text"] == "fine without it"
    [warning] = [w for w in of_type(frames, "warning") if w["code"] == "mcp_unavailable"]
    return str(warning["message"])


async def test_a_server_that_cannot_start_is_reported_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    said = await unavailable_warning(
        tmp_path, {"broken": {"command": str(tmp_path / "no-such-program")}}
    )
    assert "MCP server broken" in said
    assert "no-such-program" in said


async def test_a_changed_entry_gets_a_new_actor_and_a_disabled_one_no_tools(
    events: ServerEvents,
) -> None:
    configs = [
        mcp_config({"demo": plain_entry(tools=["echo"])}).current,
        mcp_config({"demo": plain_entry(tools=["shout"])}).current,
        mcp_config({"demo": plain_entry(tools=["shout"], enabled=False)}).current,
    ]
    current = [configs[0]]
    mcp = McpServers(lambda: current[0])
    warnings: list[Any] = []
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(mcp.run)
            profile = configs[0].profile(None)
            assert await mcp.prepare(profile, warnings.append) == ["mcp__demo__echo"]
            first = mcp.connection("demo")
            assert await mcp.prepare(profile, warnings.append) == ["mcp__demo__echo"]
            assert mcp.connection("demo") is first  # same entry: the same actor
            current[0] = configs[1]  # a reload changed the entry
            assert await mcp.prepare(profile, warnings.append) == ["mcp__demo__shout"]
            assert mcp.connection("demo") is not first and first is not None
            assert first.scope.cancel_called
            current[0] = configs[2]
            assert await mcp.prepare(profile, warnings.append) == []
            assert [s["state"] for s in mcp.status()] == ["disabled"]
            nursery.cancel_scope.cancel()
    assert warnings == []


async def test_stopped_servers_refuse_to_start_one_and_keep_nothing_of_it() -> None:
    cfg = mcp_config({"demo": stdio_entry()}).current
    mcp = McpServers(lambda: cfg)
    conf = cfg.mcp_servers["demo"]
    with pytest.raises(RuntimeError, match="not running"):
        mcp.start("demo", conf)  # not started yet
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(mcp.run)
            nursery.cancel_scope.cancel()  # the runtime shuts down
    with pytest.raises(RuntimeError, match="not running"):
        mcp.start("demo", conf)  # a late run's prepare
    assert mcp.connection("demo") is None  # no actor that never runs is left behind
    assert [s["state"] for s in mcp.status()] == ["idle"]


async def test_stderr_is_logged_line_by_line_within_bounds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from navi_trio.tools.mcp.stderr import LINE_MAX, LINES_PER_MINUTE, log_lines

    r, w = os.pipe()
    data = "x" * (LINE_MAX + 50) + "\n" + "".join(f"line {i}\n" for i in range(400))
    logger = logging.getLogger("navi_trio.mcp.stderr")
    with trio.fail_after(TIMEOUT), caplog.at_level(logging.INFO, logger=logger.name):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log_lines, trio.lowlevel.FdStream(r), logger, "s")
            async with trio.lowlevel.FdStream(w) as writer:
                await writer.send_all(data.encode())
    infos = [m.getMessage() for m in caplog.records if m.levelno == logging.INFO]
    assert len(infos) == LINES_PER_MINUTE
    assert infos[0].endswith("[… 50 characters cut]") and len(infos[0]) < LINE_MAX + 40
    assert infos[1] == "[s] line 0"
    [dropped] = [m.getMessage() for m in caplog.records if m.levelno == logging.WARNING]
    assert f"{401 - LINES_PER_MINUTE} stderr lines not logged" in dropped


@pytest.fixture
def manual_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock()


async def test_stderr_logs_again_in_the_next_minute_and_cuts_a_line_with_no_end(
    caplog: pytest.LogCaptureFixture, manual_clock: trio.testing.MockClock
) -> None:
    from navi_trio.tools.mcp.stderr import LINE_MAX, LINES_PER_MINUTE, log_lines

    r, w = os.pipe()
    logger = logging.getLogger("navi_trio.mcp.stderr")
    # the clock moves only when jumped, by 61 s once: the bound is in real time
    with real_time_limit(TIMEOUT), caplog.at_level(logging.INFO, logger=logger.name):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log_lines, trio.lowlevel.FdStream(r), logger, "s")
            async with trio.lowlevel.FdStream(w) as writer:
                lines = "".join(f"line {i}\n" for i in range(LINES_PER_MINUTE + 1))
                await writer.send_all(lines.encode())
                await trio.testing.wait_all_tasks_blocked()
                manual_clock.jump(61)  # the next minute: logged again
                await writer.send_all(b"x" * (LINE_MAX * 5))  # no end yet: its head logged
                await trio.testing.wait_all_tasks_blocked()
                await writer.send_all(b"after\n")
    infos = [m.getMessage() for m in caplog.records if m.levelno == logging.INFO]
    assert len(infos) == LINES_PER_MINUTE + 2
    assert infos[-2].startswith("[s] xxx") and "characters cut" in infos[-2]
    assert infos[-1] == "[s] after"
    [dropped] = [m.getMessage() for m in caplog.records if m.levelno == logging.WARNING]
    assert "1 stderr lines not logged" in dropped


# -- navi mcp list and navi doctor -------------------------------------------------------


def _config_dir(tmp_path: Path, servers: dict[str, Any]) -> Path:
    folder = tmp_path / "config"
    shutil.copytree(default_config_path().parent, folder)
    path = folder / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["mcp_servers"] = servers
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


SERVERS = {
    "demo": plain_entry(),
    "broken": {"command": "/nonexistent/mcp-server", "timeout_sec": 10},
    "off": {"command": "/nonexistent/other", "enabled": False},
}


def test_navi_mcp_list_shows_each_server_state_and_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from navi_trio.cli import main

    path = _config_dir(tmp_path, SERVERS)
    code = main(["mcp", "list", "--config", str(path)])
    out = capsys.readouterr()
    assert code == 1, out  # one enabled server failed to start
    lines = out.out.splitlines()
    demo = next(line for line in lines if line.startswith("demo"))
    assert "ready" in demo and "stdio" in demo
    assert "echo" in out.out and "hang" in out.out
    assert any(line.startswith("broken") and "failed" in line for line in lines)
    assert "/nonexistent/mcp-server" in out.out
    assert any(line.startswith("off") and "disabled" in line for line in lines)
    assert "navi: error: MCP server(s) broken did not start" in out.err


async def test_navi_doctor_reports_a_server_that_fails_to_start(tmp_path: Path) -> None:
    from navi_trio.cli.doctor import collect_doctor

    path = _config_dir(tmp_path, SERVERS)
    settings = Settings.from_env(
        {}, config_path=path, db_path=tmp_path / "db", llm_url="http://127.0.0.1:9"
    )
    with trio.fail_after(TIMEOUT):
        report = await collect_doctor(settings, "ws://127.0.0.1:9")
    by_name = {s["name"]: s for s in report["mcp"]}
    assert by_name["demo"]["ok"] and "echo" in by_name["demo"]["tools"]
    assert not by_name["broken"]["ok"]
    assert by_name["off"]["state"] == "disabled"
    assert any("MCP server broken" in w for w in report["warnings"])
    assert report["ok"]  # a server down is a warning, like a down LLM
