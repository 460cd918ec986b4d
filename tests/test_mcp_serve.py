"""`navi mcp serve` driven by the MCP SDK's own stdio client (issue 13, the server half).

The client spawns `navi mcp serve`, forked by tests/navi_forks.py from a process that has
imported it (`mcp_serve_command`: a process of its own on the client's pipes, which gets
its signals), with its environment pointing at the fake LLM (in the test's own trio loop)
and a private DB and data dir; through a daemon, a forked `navi serve` on port 0 runs
the turns. What a test asserts comes from the protocol (tool lists, results, progress
notifications) and from the store the runs saved to. That `navi run` does not import the
SDK is checked on a new interpreter.

Rules: see tests/test_cli.py (loopback only, port 0, real processes, an absolute
deadline on every test; nothing sleeps: a test waits for a progress notification
before it cancels). The progress pump's rate limit is tested on a MockClock.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import attrs
import navi_forks
import pytest
import trio
import trio.testing
from mcp import Client, MCPError
from mcp.client.session import ClientRequestContext, ElicitationFnT
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult
from test_cli import fake_llm_here, messages, unused_port

from navi_trio.cli.mcp_ask import LINE_MAX, ProgressPump
from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow
DEADLINE = 60
MCP_WARM = navi_forks.AGENTS_WARM  # the fork server that has imported `navi mcp serve`
ANSWER = "Hello from the fake model"
TOOL_CALL = {
    "text": "Running it.",
    "tool_calls": [{"name": "terminal", "arguments": {"action": "run", "command": "echo hi"}}],
}


@attrs.define
class Progress:
    """The progress notifications of one call; `seen(text)` waits for one containing it."""

    lines: list[str] = attrs.field(factory=list)
    _waiting: list[tuple[str, trio.Event]] = attrs.field(factory=list)

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.lines.append(message or "")
        for text, event in self._waiting:
            if text in (message or ""):
                event.set()

    async def seen(self, text: str) -> None:
        if not any(text in line for line in self.lines):
            event = trio.Event()
            self._waiting.append((text, event))
            await event.wait()


def mcp_serve_command(*args: str) -> list[str]:
    """`navi mcp serve ARGS` forked (tests/navi_forks.py) by a server that has imported
    it: a process of its own on the client's pipes, started in a fraction of a new
    interpreter's time. Blocking (the first call starts the server)."""
    return navi_forks.attach_command("mcp", "serve", *args, warm=MCP_WARM)


def _errlog(tmp_path: Path) -> TextIO:
    return open(tmp_path / "err.log", "a", encoding="utf-8")


@asynccontextmanager
async def mcp_serve(
    env: dict[str, str],
    tmp_path: Path,
    *args: str,
    command: list[str] | None = None,
    elicitation: ElicitationFnT | None = None,
    mode: str = "auto",
) -> AsyncIterator[Client]:
    """The SDK's client on a `navi mcp serve` it spawned; its stderr goes to err.log.
    `elicitation`: the client's answer to an elicitation (None: it declares none);
    `mode`: how it picks the protocol version (the SDK's `Client.mode`)."""
    argv = command
    if argv is None:
        argv = await trio.to_thread.run_sync(partial(mcp_serve_command, *args))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=tmp_path)
    with _errlog(tmp_path) as errlog:
        transport = stdio_client(params, errlog=errlog)
        async with Client(transport, elicitation_callback=elicitation, mode=mode) as client:
            yield client


def text(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def ask(client: Client, progress: Progress | None = None, **arguments: Any) -> CallToolResult:
    result = await client.call_tool("ask", arguments, progress_callback=progress)
    await trio.testing.wait_all_tasks_blocked()  # the progress callbacks the client spawned
    return result


def roles(saved: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in saved]


# ------------------------------------------------------------------ tools and answers


async def test_the_tools_are_ask_and_sessions_with_their_schemas(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with mcp_serve(env, tmp_path) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"ask", "sessions", "rewind", "fork"}
    ask_in = tools["ask"].input_schema
    assert ask_in["required"] == ["message"]
    assert set(ask_in["properties"]) == {"message", "session_id", "profile", "cwd", "on_busy"}
    assert all(p.get("description") for p in ask_in["properties"].values())
    assert tools["ask"].output_schema is not None
    assert set(tools["ask"].output_schema["required"]) >= {"answer", "session_id"}
    limit = tools["sessions"].input_schema["properties"]["limit"]
    assert limit["type"] == "integer" and limit["minimum"] == 1
    assert tools["sessions"].output_schema is not None


async def test_ask_answers_with_progress_and_the_session_id_continues_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    async with fake_llm_here([{"text": ANSWER}, {"text": "Second answer"}]) as llm:
        env = {**env, "OLLAMA_HOST": llm}
        with trio.fail_after(DEADLINE):
            async with mcp_serve(env, tmp_path) as client:
                progress = Progress()
                first = await ask(client, progress, message="hi")
                sid = first.structured_content["session_id"]
                second = await ask(client, message="and then?", session_id=sid)
                listed = await client.call_tool("sessions", {})
    assert not first.is_error and first.structured_content == {
        "answer": ANSWER, "session_id": sid, "reason": "complete", "notes": [],
    }  # fmt: skip
    assert text(first).startswith(ANSWER) and sid in text(first)  # the id in the text too
    assert f"answer: {ANSWER}" in progress.lines  # (the client may run callbacks out of order)
    assert second.structured_content["answer"] == "Second answer"
    assert roles(await messages(tmp_path / "navi.db", sid)) == [
        ("user", "hi"), ("assistant", ANSWER), ("user", "and then?"),
        ("assistant", "Second answer"),
    ]  # fmt: skip
    (row,) = listed.structured_content["sessions"]
    assert row["session_id"] == sid and row["title"] == "hi" and row["profile"] == "general"
    assert row["updated_at"] > 0 and row["updated"]


async def test_a_tool_call_shows_in_progress_and_stdout_carries_only_json_rpc(
    env: dict[str, str], tmp_path: Path
) -> None:
    # The server's stdout is copied to a file on its way to the client; NAVI_DEBUG=1
    # makes navi log every run, which must all go to stderr.
    wire = tmp_path / "stdout.log"
    command = await trio.to_thread.run_sync(mcp_serve_command)
    serve_cmd = f"{shlex.join(command)} | tee {wire}"
    async with fake_llm_here([TOOL_CALL, {"text": ANSWER}]) as llm:
        env = {**env, "OLLAMA_HOST": llm, "NAVI_DEBUG": "1"}
        with trio.fail_after(DEADLINE):
            async with mcp_serve(env, tmp_path, command=["sh", "-c", serve_cmd]) as client:
                progress = Progress()
                result = await ask(client, progress, message="run it")
    assert result.structured_content["answer"] == ANSWER
    assert any("tool terminal" in line and "echo hi" in line for line in progress.lines)
    lines = wire.read_text(encoding="utf-8").splitlines()
    assert lines and all(json.loads(line)["jsonrpc"] == "2.0" for line in lines), lines
    err = (tmp_path / "err.log").read_text(encoding="utf-8")
    assert "session_actor" in err and "run started" in err  # the logs went to stderr


async def test_a_call_that_needs_approval_is_denied_with_a_note(
    env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    call = {"name": "terminal", "arguments": {"action": "run", "command": f"touch {marker}"}}
    replies: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [call]},
        {"text": "It was denied, so I stop."},
    ]
    async with fake_llm_here(replies) as llm:
        env = {**env, "OLLAMA_HOST": llm}
        with trio.fail_after(DEADLINE):
            async with mcp_serve(env, tmp_path, "--mode", "full") as client:
                result = await ask(client, message="touch it")
    content = result.structured_content
    assert content is not None and content["answer"] == "It was denied, so I stop."
    (note,) = content["notes"]
    assert note.startswith("denied terminal") and "nobody can approve it over MCP" in note
    assert note in text(result)
    assert not marker.exists()


@attrs.define
class Elicitor:
    """An MCP client's elicitation callback: answers each question with the next of
    `answers` ("decline", or an answer accepted) and keeps the questions."""

    answers: list[str]
    questions: list[str] = attrs.field(factory=list)

    async def __call__(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult:
        self.questions.append(params.message)
        answer = self.answers.pop(0)
        if answer == "decline":
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"answer": answer})


def _touches(*markers: Path) -> list[dict[str, Any]]:
    """The fake LLM's replies (it loops them): a call per marker, then an answer. The
    first message's planning asks twice before the run: two calls go to it, so more
    than one call needs two replies for it first."""
    calls = [
        {"text": "", "tool_calls": [{"name": "terminal", "arguments": {
            "action": "run", "command": f"touch {m.name}"}}]}
        for m in markers
    ]  # fmt: skip
    planning = [{"text": "No plan."}] * 2 if len(calls) > 1 else []
    return [*planning, *calls, {"text": "Done."}]


async def _ask_elicited(
    env: dict[str, str],
    tmp_path: Path,
    elicitor: Elicitor,
    replies: list[dict[str, Any]],
    mode: str = "legacy",
) -> CallToolResult:
    """One ask in `full` mode by a client with `elicitor`; by default on the initialize
    handshake's protocol versions, where a server may ask its client during a call."""
    async with fake_llm_here(replies) as llm:
        env = {**env, "OLLAMA_HOST": llm}
        with trio.fail_after(DEADLINE):
            async with mcp_serve(
                env, tmp_path, "--mode", "full", elicitation=elicitor, mode=mode
            ) as c:
                return await ask(c, message="touch it", cwd=str(tmp_path))


async def test_an_approval_is_asked_of_the_client_through_elicitation(
    env: dict[str, str], tmp_path: Path
) -> None:
    elicitor = Elicitor(["allow_once"])
    marker = tmp_path / "ran"
    result = await _ask_elicited(env, tmp_path, elicitor, _touches(marker))
    assert result.structured_content["notes"] == [] and marker.exists()
    (question,) = elicitor.questions
    assert "navi wants to run terminal: terminal run: touch ran" in question
    assert "mode full" in question and "? ask: touch ran" in question
    assert '"allow_session" allows: `touch` with any arguments' in question


async def test_a_client_that_declines_denies_the_call(env: dict[str, str], tmp_path: Path) -> None:
    for answer in ("deny", "decline"):
        marker = tmp_path / f"ran-{answer}"
        result = await _ask_elicited(env, tmp_path, Elicitor([answer]), _touches(marker))
        (note,) = result.structured_content["notes"]
        assert note.startswith("denied terminal") and "the MCP client denied it" in note
        assert not marker.exists()


async def test_allow_for_the_session_is_not_asked_again(
    env: dict[str, str], tmp_path: Path
) -> None:
    elicitor = Elicitor(["allow_session"])
    first, second = tmp_path / "one", tmp_path / "two"
    result = await _ask_elicited(env, tmp_path, elicitor, _touches(first, second))
    assert result.structured_content["notes"] == []
    assert first.exists() and second.exists() and len(elicitor.questions) == 1


async def test_on_the_newest_protocol_approvals_are_asked_in_input_required_rounds(
    env: dict[str, str], tmp_path: Path
) -> None:
    # "auto": the 2026-07-28 protocol, where a server sends no request during a call.
    elicitor = Elicitor(["allow_once", "allow_once"])
    first, second = tmp_path / "one", tmp_path / "two"
    result = await _ask_elicited(env, tmp_path, elicitor, _touches(first, second), mode="auto")
    assert result.structured_content["notes"] == [] and not result.is_error
    assert first.exists() and second.exists()
    assert ["touch one" in q for q in elicitor.questions] == [True, False]
    assert "navi wants to run terminal: terminal run: touch two" in elicitor.questions[1]


async def test_on_the_newest_protocol_a_decline_or_a_wrong_answer_denies(
    env: dict[str, str], tmp_path: Path
) -> None:
    for answer in ("decline", "maybe"):
        marker = tmp_path / f"ran-{answer}"
        elicitor = Elicitor([answer])
        result = await _ask_elicited(env, tmp_path, elicitor, _touches(marker), mode="auto")
        (note,) = result.structured_content["notes"]
        assert note.startswith("denied terminal") and "the MCP client denied it" in note
        assert not marker.exists() and len(elicitor.questions) == 1


async def test_two_asks_at_once_in_one_session_each_get_their_own_answer(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "Answer one", "delay_chunk": 0.2},
        {"text": "Answer two"},
    ]
    async with fake_llm_here(replies) as llm:
        env = {**env, "OLLAMA_HOST": llm}
        with trio.fail_after(DEADLINE):
            async with mcp_serve(env, tmp_path) as client:
                first = await ask(client, message="start")
                sid = first.structured_content["session_id"]
                answers: list[str] = []

                async def one(message: str) -> None:
                    result = await ask(client, message=message, session_id=sid)
                    answers.append(result.structured_content["answer"])

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(one, "a")
                    nursery.start_soon(one, "b")
    assert sorted(answers) == ["Answer one", "Answer two"]
    saved = await messages(tmp_path / "navi.db", sid)
    assert [m["content"] for m in saved if m["role"] == "assistant"] == [
        "Answer one", "Answer two", "Answer one",
    ]  # fmt: skip


# ------------------------------------------------------------------ cancellation


async def cancel_when_seen(client: Client, progress: Progress, text: str, **arguments: Any) -> None:
    """Call `ask` and cancel it (the SDK sends notifications/cancelled) once `text` shows."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel() -> None:
                await progress.seen(text)
                scope.cancel()

            nursery.start_soon(cancel)
            await client.call_tool("ask", arguments, progress_callback=progress)
            raise AssertionError("the stalled ask returned")
    assert scope.cancelled_caught


async def test_cancelling_an_ask_stops_the_run_and_saves_the_stopped_turn(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "partial answer", "stall": True},
        {"text": "continued"},
    ]
    async with fake_llm_here(replies) as llm:
        env = {**env, "OLLAMA_HOST": llm}
        with trio.fail_after(DEADLINE):
            async with mcp_serve(env, tmp_path) as client:
                progress = Progress()
                await cancel_when_seen(client, progress, "partial answer", message="hi")
                listed = await client.call_tool("sessions", {})
                sid = listed.structured_content["sessions"][0]["session_id"]
                # The stopped turn is saved; the session goes on.
                after = await ask(client, message="go on", session_id=sid)
    assert after.structured_content["answer"] == "continued"
    saved = await messages(tmp_path / "navi.db", sid)
    assert roles(saved) == [("user", "hi"), ("assistant", "partial answer"),
                            ("user", "go on"), ("assistant", "continued")]  # fmt: skip
    assert saved[1].get("stopped") is True


async def test_sigterm_mid_ask_saves_the_stopped_turn_and_ends_the_server(
    env: dict[str, str], tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    # The pid is the attaching process's: it passes the SIGTERM on to the forked server.
    command = await trio.to_thread.run_sync(mcp_serve_command)
    serve_cmd = f"echo $$ > {pid_file}; exec {shlex.join(command)}"
    async with fake_llm_here([{"text": "partial answer", "stall": True}]) as llm:
        env = {**env, "OLLAMA_HOST": llm}
        with trio.fail_after(DEADLINE):
            async with mcp_serve(env, tmp_path, command=["sh", "-c", serve_cmd]) as client:
                progress = Progress()

                async def terminate() -> None:
                    await progress.seen("partial answer")
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(terminate)
                    with pytest.raises(MCPError, match="[Cc]onnection closed"):
                        await client.call_tool("ask", {"message": "hi"}, progress_callback=progress)
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        (row,) = await store.list_sessions()
        saved = await store.load_messages(row.id)
    assert roles(saved) == [("user", "hi"), ("assistant", "partial answer")]
    assert saved[1].get("stopped") is True


# ------------------------------------------------------------------ through a daemon


async def test_through_a_running_daemon_ask_deny_sessions_and_cancel(
    env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    touch = {"name": "terminal", "arguments": {"action": "run", "command": f"touch {marker}"}}
    replies: list[dict[str, Any]] = [{"text": "", "tool_calls": [touch]}, {"text": ANSWER},
               {"text": "partial answer", "stall": True}, {"text": "continued"}]  # fmt: skip
    async with fake_llm_here(replies) as llm:
        with trio.fail_after(DEADLINE):
            async with navi_forks.serving(env, llm, warm=MCP_WARM) as daemon:
                daemon_log = b""
                # In `full` mode the terminal call asks: over MCP it is denied.
                args = ("--url", daemon.url, "--mode", "full")
                async with mcp_serve(env, tmp_path, *args) as client:
                    progress = Progress()
                    first = await ask(client, progress, message="hi")
                    sid = first.structured_content["session_id"]
                    await cancel_when_seen(
                        client, Progress(), "partial answer", message="more", session_id=sid
                    )
                    after = await ask(client, message="go on", session_id=sid)
                    listed = await client.call_tool("sessions", {})
                daemon_log = await daemon.stderr.receive_some(1 << 20)
    assert first.structured_content["answer"] == ANSWER
    assert any("tool terminal" in line for line in progress.lines)
    (note,) = first.structured_content["notes"]
    assert note.startswith("denied terminal") and any(note in line for line in progress.lines)
    assert not marker.exists()
    assert after.structured_content["answer"] == "continued"
    (row,) = listed.structured_content["sessions"]
    assert row["session_id"] == sid and row["title"] == "hi"
    saved = await messages(tmp_path / "navi.db", sid)
    assert [r for r in roles(saved) if r[0] == "user"] == [
        ("user", "hi"), ("user", "more"), ("user", "go on")
    ]  # fmt: skip
    stopped = [m for m in saved if m.get("stopped")]
    assert [m["content"] for m in stopped] == ["partial answer"]
    # The daemon ran them: its log says so (this process opened no runtime).
    assert f"session {sid}: run started".encode() in daemon_log
    assert "runtime open in this process" not in (tmp_path / "err.log").read_text()


async def test_a_daemon_asked_for_that_does_not_answer_is_a_tool_error(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = f"ws://127.0.0.1:{unused_port()}/"
    with trio.fail_after(DEADLINE):
        async with mcp_serve(env, tmp_path, "--url", url, "--token", "t") as client:
            result = await ask(client, message="hi")
    assert result.is_error and f"no daemon answers at {url}" in text(result)


# ------------------------------------------------------------------ bad arguments


BAD_ASKS: list[tuple[dict[str, Any], Callable[[Path], str]]] = [
    ({}, lambda _: "message"),
    ({"message": 3}, lambda _: "message"),
    ({"message": "  "}, lambda _: "message is empty"),
    ({"message": "hi", "session_id": "../x"}, lambda _: "session_id: invalid session id '../x'"),
    ({"message": "hi", "session_id": "s-nope"}, lambda _: "no session 's-nope'"),
    ({"message": "hi", "cwd": "nowhere"}, lambda p: f"cwd '{p / 'nowhere'}' is not a directory"),
    ({"message": "hi", "profile": "nope"}, lambda _: "unknown profile 'nope' (profiles: coder"),
]


async def test_bad_arguments_are_tool_errors_naming_the_problem(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Nothing reaches an LLM: a configured URL where nothing listens.
    env = {**env, "OLLAMA_HOST": f"http://127.0.0.1:{unused_port()}"}
    results = []
    with trio.fail_after(DEADLINE):
        async with mcp_serve(env, tmp_path) as client:
            for arguments, _ in BAD_ASKS:
                results.append(await client.call_tool("ask", arguments))
            results.append(await client.call_tool("sessions", {"limit": 0}))
            empty = await client.call_tool("sessions", {})
    for (arguments, expected), result in zip(BAD_ASKS, results, strict=False):
        assert result.is_error, (arguments, result)
        assert expected(tmp_path) in text(result), (arguments, text(result))
    assert results[-1].is_error and "limit" in text(results[-1])
    assert not empty.is_error and empty.structured_content == {"sessions": []}
    assert "Traceback" not in (tmp_path / "err.log").read_text(encoding="utf-8")


# ------------------------------------------------------------------ start-up


async def test_navi_run_does_not_import_the_mcp_sdk(tmp_path: Path) -> None:
    code = (
        "import sys, navi_trio.cli, navi_trio.cli.run; navi_trio.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))"
    )
    with trio.fail_after(DEADLINE):
        done = await trio.run_process(
            [sys.executable, "-c", code], capture_stdout=True, stderr=subprocess.DEVNULL
        )
    assert done.stdout.decode().strip() == "[]"


# ------------------------------------------------------------------ the progress pump


async def test_progress_is_rate_limited_bounded_and_flushed_at_the_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent: list[tuple[float, float, str]] = []

    async def report(progress: float, line: str) -> None:
        sent.append((trio.current_time(), progress, line))

    pump = ProgressPump(report, interval=1.0, limit=5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump.run)
        pump.step("tool a")
        await trio.testing.wait_all_tasks_blocked()
        for i in range(100):  # a burst: coalesced into the next notification
            pump.step(f"tool b{i}")
            pump.text(f"word{i} ")
        await trio.sleep(2.5)
        pump.text("x" * 1000)
        pump.finish()
    times = [t for t, _, _ in sent]
    assert [p for _, p, _ in sent] == [1.0, 2.0, 3.0, 4.0]
    assert sent[0][2] == "tool a" and times[1] - times[0] >= 1.0 and times[2] - times[1] >= 1.0
    assert "tool b99" in sent[1][2] and "tool b0 " not in sent[1][2]  # the oldest dropped
    assert len(sent[1][2]) <= LINE_MAX and sent[2][2].startswith("answer: ")
    # `finish` cuts the rate limit's wait: the rest goes out at once, the call returns.
    assert sent[3][2].startswith("answer: ") and sent[3][1] == 4.0 and times[3] == 2.5
    # Bounded: past `limit` nothing more goes out.
    pump = ProgressPump(report, interval=0.1, limit=2)
    sent.clear()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump.run)
        for i in range(10):
            pump.step(f"s{i}")
            await trio.sleep(1)
        pump.finish()
    assert len(sent) == 2
