"""MCP servers that misbehave (issue 17 "Missing tests"): one that never answers
``initialize`` or ``tools/list`` fails its start within `timeout_sec`, saying which
request went unanswered; one that was ready and then crashes restarts with its backoff
reset, and the backoff doubles while it keeps failing to start; a tool whose input
schema is not an object is skipped with a warning, the others are offered.

Rules: the server is tests/mcp_servers/scripted.py, a real child process over stdio;
what it got reaches the test as ``EVENT`` lines through navi's log of its stderr (the
`events` fixture of tests/test_mcp_client.py). The MockClock moves only by hand, so a
timeout or a backoff is checked to the second: not yet just before it, done just after.
As a safety net only, STALL idle real seconds let it move, and a real-time limit bounds
each test.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from realtime import real_time_limit
from test_mcp_client import STALL, ServerEvents, events, mcp_config

from navi_trio.profiles import McpServerConfig
from navi_trio.settings import Settings
from navi_trio.tools.base import ToolContext
from navi_trio.tools.mcp import McpServers
from navi_trio.tools.mcp.connection import BACKOFF_FIRST, MAX_FAILURES, McpConnection

__all__ = ["events"]  # the fixture, imported for pytest
SCRIPTED = Path(__file__).parent / "mcp_servers" / "scripted.py"
LIMIT = 60  # real seconds
pytestmark = pytest.mark.slow  # a real child process per test


def entry(tmp_path: Path, plan: str, **extra: Any) -> dict[str, Any]:
    env = {"SCRIPT_PLAN": plan, "SCRIPT_COUNTER": str(tmp_path / "starts")}
    env.update({k: str(v) for k, v in extra.pop("env", {}).items()})
    return {"command": sys.executable, "args": [str(SCRIPTED)], "env": env, **extra}


@asynccontextmanager
async def running(
    tmp_path: Path, plan: str, clock: trio.testing.MockClock, **extra: Any
) -> AsyncIterator[McpConnection]:
    """The actor of one scripted server, in a nursery of its own."""
    data = entry(tmp_path, plan, **extra)
    config = McpServerConfig(
        command=data["command"], args=tuple(data["args"]), env=data["env"],
        timeout_sec=data.get("timeout_sec", 60.0),
    )  # fmt: skip
    actor = McpConnection("scripted", config)
    clock.autojump_threshold = STALL
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        try:
            yield actor
        finally:
            clock.autojump_threshold = 0  # the SDK's shutdown polls on the clock: let it fly
            nursery.cancel_scope.cancel()


async def idle() -> None:
    await trio.testing.wait_all_tasks_blocked(cushion=0.01)


@pytest.mark.parametrize(
    ("plan", "last", "unanswered"),
    [("silent", "got initialize", "initialize"), ("no-list", "got tools/list", "tools/list")],
)
async def test_a_server_that_never_answers_fails_its_start_within_timeout_sec(
    tmp_path: Path,
    events: ServerEvents,
    mock_clock: trio.testing.MockClock,
    plan: str,
    last: str,
    unanswered: str,
) -> None:
    with real_time_limit(LIMIT):
        async with running(tmp_path, plan, mock_clock, timeout_sec=3) as actor:
            mock_clock.autojump_threshold = math.inf  # only our jumps move it
            await events.wait_for(last)
            await idle()
            mock_clock.jump(2.9)
            await idle()
            assert (actor.state, actor.settled.is_set()) == ("starting", False)
            mock_clock.jump(0.2)
            # Given up: the SDK closes the server's input (then waits for it to exit).
            await events.wait_for("end of input")
            mock_clock.autojump_threshold = 0  # that wait polls on the clock
            await actor.settled.wait()
            assert actor.state == "restarting" and not actor.ever_ready
            assert actor.error == (
                f"no answer to {unanswered} within 3 s (timeout_sec) while starting"
            )
            assert actor.unavailable().startswith("MCP server scripted could not start (no")


class Restarts(logging.Handler):
    """The actor's "restarting in N s" lines, logged just before it sleeps N s: each
    delay, and the (virtual) time it was logged at."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.delays: list[tuple[float, float]] = []
        self.lines: list[str] = []  # the whole lines, with why each attempt ended
        self._changed = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "; restarting in " in text:
            delay = float(text.rsplit("restarting in ", 1)[1].split()[0])
            self.delays.append((delay, trio.current_time()))
            self.lines.append(text)
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, count: int) -> tuple[float, float]:
        while len(self.delays) < count:
            await self._changed.wait()
        return self.delays[count - 1]


@pytest.fixture
def restarts() -> Iterator[Restarts]:
    handler = Restarts()
    logger = logging.getLogger("navi_trio.mcp")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def _tick(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """A deadline every TICK: while the child works in real time, the autojump clock
    creeps by TICK, never all the way to a far deadline (the SDK's shutdown polls)."""
    task_status.started()
    while True:  # noqa: ASYNC110 -- the deadlines are the point, not a wait
        await trio.sleep(TICK)


TICK = 0.02  # virtual: 20 ms per jump while the child works, about 20 times real time
IDLE = 0.001  # real seconds every task waits before the clock jumps


async def test_backoff_doubles_while_starts_fail_and_resets_after_a_ready_start(
    tmp_path: Path,
    events: ServerEvents,
    restarts: Restarts,
    mock_clock: trio.testing.MockClock,
) -> None:
    # Three failed starts (0.5, 1, 2 s after them), one that got ready and crashed: the
    # next try comes 0.5 s after it again, not 4 s; then the failures double anew.
    # The clock jumps from deadline to deadline, so each try starts exactly its backoff
    # after the line that announced it. The ready one crashes at a call made once it is
    # ready: a server exiting right after its tools/list answer raced that answer, and
    # now and then the client saw a failed start (a 4th delay of 4 s).
    plan = "fail,fail,fail,ready-crash,fail,fail,ready"
    expected = [1, 2, 4, 1, 1, 2]  # in units of BACKOFF_FIRST
    cfg = mcp_config({}).current
    settings = Settings.from_env({}, db_path=tmp_path / "db", data_dir=tmp_path / "d")
    ctx = ToolContext(
        session_id="s", session_dir=tmp_path, kv=None,  # type: ignore[arg-type]
        settings=settings, profile=cfg.profile(None), config=cfg,
    )  # fmt: skip
    with real_time_limit(LIMIT):
        async with trio.open_nursery() as ticker:
            await ticker.start(_tick)
            async with running(tmp_path, plan, mock_clock, timeout_sec=1e6) as actor:
                # Not 0: a loop that jumps at every pass spins hot and holds the GIL from
                # the worker thread that scans /proc for a failed start's strays (a root
                # daemon scans every process): on a loaded machine one scan took the
                # whole real-time limit. After IDLE of real time, the jump is to the
                # nearest deadline as before, so each try is still exactly its delay.
                mock_clock.autojump_threshold = IDLE
                for start, units in enumerate(expected, 1):
                    if plan.split(",")[start - 1] == "ready-crash":
                        await actor.until("ready", starts=start)
                        crashed = await actor.call("echo", {"text": "hi"}, ctx)
                        assert not crashed.ok, crashed  # it crashed at the call
                    delay, logged_at = await restarts.wait_for(start)  # attempt over
                    # What each attempt ended on, and what the server did, for a failure.
                    seen = (start, restarts.lines, events.lines)
                    assert delay == units * BACKOFF_FIRST, seen
                    await actor.until("restarting", starts=start + 1)
                    assert trio.current_time() - logged_at == pytest.approx(delay, abs=1e-6)
                await actor.until("ready", starts=len(expected) + 1)
            ticker.cancel_scope.cancel()
    assert events.lines[:2] == ["start 1 fail", "start 2 fail"]
    assert "start 4 ready-crash" in events.lines and "crash" in events.lines


async def test_a_server_failing_its_start_five_times_in_a_row_is_left_failed(
    tmp_path: Path, events: ServerEvents, mock_clock: trio.testing.MockClock
) -> None:
    # It would get ready at its 6th start: only a run needing it (`retry`) starts it again.
    assert MAX_FAILURES == 5
    plan = ",".join(["fail"] * MAX_FAILURES + ["ready"])
    with real_time_limit(LIMIT):
        async with trio.open_nursery() as ticker:
            await ticker.start(_tick)
            async with running(tmp_path, plan, mock_clock, timeout_sec=1e6) as actor:
                mock_clock.autojump_threshold = IDLE  # (as in the backoff test above)
                await actor.until("failed", starts=MAX_FAILURES)
                assert actor.starts == MAX_FAILURES
                actor.retry()
                await actor.until("ready", starts=MAX_FAILURES + 1)
            ticker.cancel_scope.cancel()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon looks for the program first")
async def test_a_program_that_is_not_there_fails_its_start_with_no_wait(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """A root daemon looks for the program before it starts it as the tool user: when
    it is not there, nothing ran, so the attempt ends at once. The clock moves only by
    hand here: a wait for the child's stderr to close (STOP_GRACE, the pipe's write end
    left open) would never end (the real-time limit would fail the test)."""
    missing = tmp_path / "no-such-program"
    actor = McpConnection("missing", McpServerConfig(command=str(missing), timeout_sec=60.0))
    mock_clock.autojump_threshold = math.inf
    start = trio.current_time()
    with real_time_limit(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            await actor.until("restarting")
            nursery.cancel_scope.cancel()
    assert trio.current_time() == start
    assert actor.error is not None and "FileNotFoundError" in actor.error, actor.error
    assert str(missing) in actor.error


NOT_OBJECTS = [
    {"name": "scalar", "description": "a string schema", "inputSchema": {"type": "string"}},
    {"name": "listy", "description": "an array schema", "inputSchema": {"type": "array"}},
    {"name": "odd", "description": "bad properties",
     "inputSchema": {"type": "object", "properties": ["a", "b"]}},
]  # fmt: skip


async def test_a_tool_whose_input_schema_is_not_an_object_is_skipped_with_a_warning(
    tmp_path: Path, events: ServerEvents
) -> None:
    echo = {
        "name": "echo",
        "description": "Return the text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
    tools = json.dumps([*NOT_OBJECTS, echo])
    cfg = mcp_config({"scripted": entry(tmp_path, "ready", env={"SCRIPT_TOOLS": tools})})
    warnings: list[Any] = []
    mcp = McpServers(lambda: cfg.current)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(mcp.run)
            names = await mcp.prepare(cfg.current.profile(None), warnings.append)
            nursery.cancel_scope.cancel()
    assert names == ["mcp__scripted__echo"]
    texts = [w.message for w in warnings]
    assert all(w.code == "mcp_tools" for w in warnings), warnings
    assert len(texts) == 3, texts
    for tool, why in [("scalar", "type 'string'"), ("listy", "type 'array'"),
                      ("odd", "properties is not an object")]:  # fmt: skip
        [text] = [t for t in texts if f"'{tool}'" in t]
        assert text.startswith("MCP server scripted: tool") and "skipped" in text, text
        assert why in text, text


@pytest.fixture(autouse=True)
def _quiet_sdk() -> Iterator[None]:
    """The SDK logs a failed start at length; the test reads the actor's error instead."""
    logger = logging.getLogger("mcp")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(old)
