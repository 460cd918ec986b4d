"""on_busy from the clients (issue 23): `navi run --on-busy`, MCP `ask`'s on_busy.

`navi run`'s daemon path (`run_remote`) and the MCP server's bridge (`NaviBridge.ask`)
run here against a real daemon on 127.0.0.1 (tests/api_ws.py): real WebSocket, real
SQLite, the fake LLM over HTTP. The runs they meet wait in a gate tool the test opens;
nothing sleeps, every test has an absolute deadline.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import GateTool, call, toolset, with_tools
from api_ws import Client, Daemon, open_daemon
from test_on_busy import send

from navi_trio.api.endpoint import RunTarget
from navi_trio.cli import build_parser
from navi_trio.cli.mcp_server import NaviBridge, ServeOptions
from navi_trio.cli.run import run_remote
from navi_trio.cli.runner import RunRequest
from navi_trio.errors import RemoteError, UsageError
from navi_trio.settings import Settings

TIMEOUT = 20


def gated(tmp_path: Path, gate: GateTool, *replies: dict[str, Any]) -> Any:
    return open_daemon(
        tmp_path, replies=[call("gate"), *replies], tools=toolset(gate),
        profiles={"general": with_tools(["gate"], planning_first_message=False)},
    )  # fmt: skip


def request(sid: str, text: str, on_busy: str, tmp_path: Path) -> RunRequest:
    return RunRequest(sid, text, tmp_path, None, False, on_busy=on_busy, cwd_given=False)


async def busy_session(c: Client, gate: GateTool) -> str:
    """The session of a first message whose run waits in the gate."""
    ok = await send(c, "work")
    await gate.entered.wait()
    return str(ok["session_id"])


def steer_arrives(d: Daemon, sid: str, count: int = 1) -> trio.Event:
    """Set when the daemon has handed `count` steered messages to the session's
    running turn."""
    actor = d.harness.runtime.sessions.actor(sid)
    assert actor is not None and actor._control is not None
    injections = actor._control.injections
    arrived, steer = trio.Event(), injections.steer
    seen: list[Any] = []

    def steered(item: Any) -> None:
        steer(item)
        seen.append(item)
        if len(seen) >= count:
            arrived.set()

    injections.steer = steered  # type: ignore[method-assign]
    return arrived


def test_navi_run_takes_on_busy_and_refuses_another_word() -> None:
    args = build_parser().parse_args(["run", "--on-busy", "steer", "hi"])
    assert args.on_busy == "steer"
    with pytest.raises(UsageError, match="on-busy"):
        build_parser().parse_args(["run", "--on-busy", "push", "hi"])


async def test_navi_run_steer_follows_the_running_turn_to_its_end(tmp_path: Path) -> None:
    gate = GateTool()
    with trio.fail_after(TIMEOUT):
        async with gated(tmp_path, gate, {"text": "steered answer"}) as d, d.connect("alice") as c:
            sid = await busy_session(c, gate)
            out, err = io.StringIO(), io.StringIO()
            async with trio.open_nursery() as nursery:
                done: list[Any] = []

                async def run() -> None:
                    req = request(sid, "in French", "steer", tmp_path)
                    done.append(await run_remote(d.url, d.tokens["alice"], req, out, err))

                arrived = steer_arrives(d, sid)
                nursery.start_soon(run)
                await arrived.wait()  # the daemon put it in the running turn's mailbox
                gate.gate.set()
            (outcome,) = done
            assert outcome.end is not None and outcome.end.text == "steered answer"
            assert "steered answer" in out.getvalue()
            assert "message steered into the running turn" in err.getvalue()


async def test_navi_run_reject_is_the_daemons_session_busy(tmp_path: Path) -> None:
    gate = GateTool()
    with trio.fail_after(TIMEOUT):
        async with gated(tmp_path, gate, {"text": "done"}) as d, d.connect("alice") as c:
            sid = await busy_session(c, gate)
            req = request(sid, "again", "reject", tmp_path)
            busy = pytest.RaisesGroup(
                pytest.RaisesExc(RemoteError, check=lambda e: e.code == "session_busy"),
                allow_unwrapped=True, flatten_subgroups=True,
            )  # fmt: skip
            with busy:
                await run_remote(d.url, d.tokens["alice"], req, io.StringIO(), io.StringIO())
            gate.gate.set()
            await c.until_end(sid)


async def test_mcp_ask_interrupt_stops_the_run_and_answers_the_new_message(
    tmp_path: Path,
) -> None:
    gate = GateTool()
    with trio.fail_after(TIMEOUT):
        async with gated(tmp_path, gate, {"text": "the new answer"}) as d, d.connect("root") as c:
            sid = await busy_session(c, gate)
            # An admin: its cwd (the server's folder) is taken as it is.
            target = RunTarget(url=d.url, token=d.tokens["root"], data_dir=tmp_path,
                               embedded=False)  # fmt: skip
            options = ServeOptions(target=target, settings=Settings.from_env({}),
                                   llm_configured=True)  # fmt: skip
            lines: list[str] = []

            async def report(progress: float, line: str) -> None:
                lines.append(line)

            async with trio.open_nursery() as nursery:
                bridge = NaviBridge(options, nursery)
                result = await bridge.ask("do this instead", sid, None, None, report, "interrupt")
                nursery.cancel_scope.cancel()
            first = await c.until_end(sid)
            assert first["reason"] == "stopped"
            assert result.structured_content is not None
            assert result.structured_content["answer"] == "the new answer"
            assert result.structured_content["session_id"] == sid
            with pytest.raises(Exception, match="on_busy must be one of"):
                await NaviBridge(options, nursery).ask("x", sid, None, None, report, "shove")
