"""`navi acp` driven end to end by the official ACP Python SDK's client.

The client (tests/acp_sdk_client.py, asyncio) runs in a process of its own and spawns
`navi acp` with its environment pointing at the fake LLM and a private DB and data
folder: the agent then runs its sessions in a daemon of its own process, or, with --url,
in a real `navi serve`. The clients, agents and daemons are forked by tests/navi_forks.py
from a process that has imported them (`client_command`, `navi_command`): each is a
process of its own on its caller's pipes and gets its signals, without a new
interpreter's start. What a test asserts comes from the protocol (replies, updates,
permission requests) and from the store and the files the runs left.

The tests that need no fresh agent share one (`agent`, tests/acp_shared.py): sessions
and a working folder of their own, the fake LLM made new for each. Those that start,
stop, configure or crash the agent, or need a daemon, start their own.

Rules: loopback only, port 0, real processes, an absolute deadline on every test;
nothing sleeps: a cancel is sent once the update it waits for came.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, closing
from functools import partial
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from acp_shared import ACP_WARM, Lines, SharedAgent, client_command, navi_command
from daemons import no_plan_config
from test_cli import fake_llm_here, messages
from test_mcp_client import PLAIN, ServerEvents, http_server

from navi_trio.api.auth import new_token
from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow
DEADLINE = 90
WRITE_NOTES = {
    "name": "filesystem",
    "arguments": {"action": "write", "path": "notes.txt", "content": "hello\n"},
}


@pytest.fixture
def env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The clean environment, with a config whose first message makes no plan (the
    scripts hold no plan replies)."""
    return {**env, "NAVI_CONFIG": str(no_plan_config(tmp_path))}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedAgent]:
    """The module's agent and fake LLM (one per xdist worker that runs its tests)."""
    with closing(SharedAgent(tmp_path_factory.mktemp("acp"))) as agent:
        yield agent


@pytest.fixture
def agent(shared: SharedAgent, env: dict[str, str], tmp_path: Path) -> SharedAgent:
    """The module's agent, ready for a test, its sessions in tmp_path/work: the DB is
    `agent.db`, not the test's."""
    return shared.ready(env, tmp_path / "work")


async def sdk_client(
    env: dict[str, str],
    tmp_path: Path,
    steps: Sequence[dict[str, Any]],
    *args: str,
    llm: str | None = None,
    name: str = "scenario",
) -> list[dict[str, Any]]:
    """Run the SDK's client on `steps` with an agent of its own (with `llm`: `navi acp
    --llm-url llm`); one dict per step, the initialize's first."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path = tmp_path / f"{name}.json"
    args = (*args, "--llm-url", llm) if llm is not None else args
    agent = await trio.to_thread.run_sync(partial(navi_command, "acp", *args))
    scenario = {"agent": agent, "env": env, "cwd": str(work), "steps": list(steps)}
    path.write_text(json.dumps(scenario), encoding="utf-8")
    with open(tmp_path / "err.log", "ab") as errlog:  # noqa: ASYNC230
        client = await trio.to_thread.run_sync(client_command, str(path))
        done = await trio.run_process(
            client,
            capture_stdout=True,
            stderr=errlog,
            check=False,
            env=env,
        )
    err = (tmp_path / "err.log").read_text(encoding="utf-8", errors="replace")
    assert done.returncode == 0, err[-3000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def kinds(step: dict[str, Any]) -> list[str]:
    return [u["sessionUpdate"] for u in step["updates"]]


def said(step: dict[str, Any], kind: str = "agent_message_chunk") -> str:
    return "".join(u["content"]["text"] for u in step["updates"] if u["sessionUpdate"] == kind)


async def test_a_prompt_streams_text_and_a_write_is_an_edit_with_its_diff(
    agent: SharedAgent, tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "Writing it.", "tool_calls": [WRITE_NOTES]},
        {"text": "Wrote the notes"},
    ]
    with trio.fail_after(DEADLINE):
        init, new, prompt = await agent.run(
            [{"op": "new"}, {"op": "prompt", "text": "write notes"}], replies
        )
    caps = init["result"]["agentCapabilities"]
    assert init["result"]["protocolVersion"] == 1 and caps["loadSession"] is True
    assert caps["promptCapabilities"]["embeddedContext"] is True
    assert init["result"]["agentInfo"]["name"] == "navi"
    sid = new["result"]["sessionId"]
    assert [m["id"] for m in new["result"]["modes"]["availableModes"]] == [
        "read-only",
        "workspace",
        "full",
    ]
    assert new["result"]["configOptions"][0]["id"] == "profile"
    assert prompt["result"]["stopReason"] == "end_turn"
    assert prompt["result"]["usage"]["totalTokens"] > 0
    assert said(prompt) == "Writing it.Wrote the notes"
    target = str(tmp_path / "work" / "notes.txt")
    (start,) = [u for u in prompt["updates"] if u["sessionUpdate"] == "tool_call"]
    assert start["kind"] == "edit" and start["title"] == "write notes.txt"
    assert start["locations"] == [{"path": target}]
    done = [u for u in prompt["updates"] if u.get("status") == "completed"]
    (change,) = [c for c in done[0]["content"] if c["type"] == "diff"]
    assert change == {"type": "diff", "path": target, "newText": "hello\n"}
    assert (tmp_path / "work" / "notes.txt").read_text() == "hello\n"
    assert "available_commands_update" in kinds(prompt) + kinds(new)
    saved = await messages(agent.db, sid)
    assert saved[0]["role"] == "user" and saved[0]["content"] == "write notes"


async def test_the_todo_list_is_the_editors_plan(agent: SharedAgent, tmp_path: Path) -> None:
    add = {"name": "todo", "arguments": {"action": "replace", "texts": ["read", "fix"]}}
    start = {"name": "todo", "arguments": {"action": "update", "index": 1, "status": "in_progress"}}
    replies: list[dict[str, Any]] = [{"tool_calls": [add]}, {"tool_calls": [start]}, {"text": "ok"}]
    with trio.fail_after(DEADLINE):
        _, _, prompt = await agent.run(
            [{"op": "new"}, {"op": "prompt", "text": "plan it"}], replies
        )
    plans = [u["entries"] for u in prompt["updates"] if u["sessionUpdate"] == "plan"]
    assert [[(e["content"], e["status"]) for e in p] for p in plans] == [
        [("read", "pending"), ("fix", "pending")],
        [("read", "in_progress"), ("fix", "pending")],
    ]
    (first, _) = [u for u in prompt["updates"] if u["sessionUpdate"] == "tool_call"]
    assert first["kind"] == "think"


async def test_the_rewind_command_undoes_the_last_message_chat_and_files(
    agent: SharedAgent, tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "kept"},
        {"text": "Writing.", "tool_calls": [WRITE_NOTES]},
        {"text": "Wrote it"},
    ]
    steps: list[dict[str, Any]] = [
        {"op": "new"},
        {"op": "prompt", "text": "first"},
        {"op": "prompt", "text": "write notes"},
        {"op": "prompt", "text": "/rewind"},
    ]
    with trio.fail_after(DEADLINE):
        _, new, first, wrote, rewound = await agent.run(steps, replies)
    names = [
        c["name"]
        for u in new["updates"] + first["updates"] + wrote["updates"]
        if u["sessionUpdate"] == "available_commands_update"
        for c in u["availableCommands"]
    ]
    assert set(names) >= {"compact", "rewind", "fork"}
    assert rewound["result"]["stopReason"] == "end_turn"
    assert said(rewound).startswith("navi: rewound to before 'write notes'"), said(rewound)
    assert not (tmp_path / "work" / "notes.txt").exists()
    saved = await messages(agent.db, new["result"]["sessionId"])
    assert [m["content"] for m in saved] == ["first", "kept"]


def touch(marker: Path) -> dict[str, Any]:
    command = f"touch {marker}"
    return {
        "tool_calls": [{"name": "terminal", "arguments": {"action": "run", "command": command}}]
    }


async def test_permission_requests_answered_allow_reject_and_cancelled(
    agent: SharedAgent, tmp_path: Path
) -> None:
    allowed, rejected, cancelled = tmp_path / "allowed", tmp_path / "rejected", tmp_path / "c"
    errored = tmp_path / "errored"
    replies: list[dict[str, Any]] = [
        touch(allowed), {"text": "ran it"},
        touch(rejected), {"text": "it was refused"},
        touch(cancelled), {"text": "not asked again"},
        touch(errored), {"text": "the editor failed"},
    ]  # fmt: skip
    steps: list[dict[str, Any]] = [
        {"op": "new"},
        {"op": "set_mode", "mode": "full"},  # (`navi acp --mode full`: test_acp_acpx)
        {"op": "prompt", "text": "one", "permission": "allow_once"},
        {"op": "prompt", "text": "two", "permission": "reject_once"},
        {"op": "prompt", "text": "three", "permission": "cancelled"},
        {"op": "prompt", "text": "four", "permission": "error"},  # an error reply denies
    ]
    with trio.fail_after(DEADLINE):
        _, _, full, first, second, third, fourth = await agent.run(steps, replies)
    assert "error" not in full, full
    (asked,) = first["permissions"]
    assert [o["kind"] for o in asked["options"]] == [
        "allow_once", "allow_always", "reject_once", "reject_always"
    ]  # fmt: skip
    assert asked["toolCall"]["kind"] == "execute"
    assert asked["toolCall"]["title"] == f"$ touch {allowed}"
    # the line's parts, and in words what "Allow always" grants
    texts = [c["content"]["text"] for c in asked["toolCall"]["content"] if c["type"] == "content"]
    assert f"? ask: touch {allowed} (outside the workspace: {allowed})" in texts[-1]
    assert '"Allow always" allows: `touch` with any arguments on any path' in texts[-1]
    assert allowed.exists() and said(first) == "ran it"
    for step, marker in ((second, rejected), (third, cancelled), (fourth, errored)):
        assert len(step["permissions"]) == 1
        assert not marker.exists()
        (failed,) = [u for u in step["updates"] if u.get("status") == "failed"]
        assert failed["sessionUpdate"] == "tool_call_update"
    assert said(second) == "it was refused" and said(third) == "not asked again"
    assert said(fourth) == "the editor failed"


async def test_cancel_mid_stream_answers_cancelled_within_a_second_and_saves_the_partial(
    agent: SharedAgent, tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [{"text": "partial answer", "stall": True}]
    steps: list[dict[str, Any]] = [
        {"op": "new"},
        {"op": "prompt", "text": "go", "cancel_on": "agent_message_chunk"},
    ]
    with trio.fail_after(DEADLINE):
        _, new, prompt = await agent.run(steps, replies)
    assert prompt["result"]["stopReason"] == "cancelled"
    assert prompt["answered_at"] - prompt["cancelled_at"] < 1.0
    saved = await messages(agent.db, new["result"]["sessionId"])
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert saved[1]["content"].startswith("partial")


async def test_modes_and_the_profile_go_with_the_next_prompt(
    agent: SharedAgent, tmp_path: Path
) -> None:
    write = {
        "name": "filesystem",
        "arguments": {"action": "write", "path": "x.txt", "content": "x"},
    }
    replies: list[dict[str, Any]] = [{"text": "", "tool_calls": [write]}, {"text": "could not"}]
    steps: list[dict[str, Any]] = [
        {"op": "new"},
        {"op": "set_mode", "mode": "read-only"},
        {
            "op": "raw",
            "method": "session/set_config_option",
            "params": {"sessionId": "SID", "configId": "profile", "value": "coder"},
        },
        {"op": "prompt", "text": "write x"},
        {"op": "set_mode", "mode": "sideways"},
    ]
    with trio.fail_after(DEADLINE):
        _, new, mode, profile, prompt, bad = await agent.run(steps, replies)
    assert "error" not in mode, mode
    assert profile["result"]["configOptions"][0]["currentValue"] == "coder", profile
    assert not (tmp_path / "work" / "x.txt").exists()
    (failed,) = [u for u in prompt["updates"] if u.get("status") == "failed"]
    assert failed["sessionUpdate"] == "tool_call_update"
    assert bad["error"]["code"] == -32602 and "sideways" in bad["error"]["message"]
    async with SQLiteStore.open(agent.db) as store:
        row = await store.get_session(new["result"]["sessionId"])
    assert row is not None and row.profile_id == "coder"


async def test_a_test_cut_short_hands_the_next_one_a_fresh_agent(
    agent: SharedAgent, env: dict[str, str], tmp_path: Path
) -> None:
    """The sharing itself: a test that stops mid-scenario (here while the fake LLM holds
    its reply) leaves the agent in doubt; the next test gets a new one, which answers."""
    assert agent.loop is not None
    llm = agent.loop.llm
    with trio.fail_after(DEADLINE):
        await trio.to_thread.run_sync(agent.loop.call, llm.hold_after, 0)
        async with trio.open_nursery() as nursery:
            steps = [{"op": "new"}, {"op": "prompt", "text": "go"}]
            nursery.start_soon(agent.run, steps, [{"text": "never seen"}])
            await trio.to_thread.run_sync(agent.loop.run, llm.wait_held, 1)
            nursery.cancel_scope.cancel()
        assert agent.dirty
        starts = agent.starts
        await trio.to_thread.run_sync(agent.ready, env, tmp_path / "work")
        assert agent.starts == starts + 1 and agent.loop.llm is not llm
        _, _, prompt = await agent.run(
            [{"op": "new"}, {"op": "prompt", "text": "hi"}], [{"text": "fresh"}]
        )
    assert said(prompt) == "fresh"


async def test_a_session_loaded_in_a_new_process_replays_its_conversation(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [{"text": "first answer"}, {"text": "second answer"}]
    async with fake_llm_here(replies) as llm:
        with trio.fail_after(DEADLINE):
            _, new, _ = await sdk_client(
                env,
                tmp_path,
                [{"op": "new"}, {"op": "prompt", "text": "question one"}],
                llm=llm,
                name="one",
            )
            sid = new["result"]["sessionId"]
            steps: list[dict[str, Any]] = [
                {"op": "list"},
                {"op": "load", "id": sid},
                {"op": "prompt", "text": "question two"},
            ]
            _, listed, loaded, _ = await sdk_client(env, tmp_path, steps, llm=llm, name="two")
    assert [s["sessionId"] for s in listed["result"]["sessions"]] == [sid]
    assert [
        (u["sessionUpdate"], u["content"]["text"]) for u in loaded["updates"] if "content" in u
    ] == [("user_message_chunk", "question one"), ("agent_message_chunk", "first answer")]
    saved = await messages(tmp_path / "navi.db", sid)
    assert [m["content"] for m in saved] == [
        "question one",
        "first answer",
        "question two",
        "second answer",
    ]


async def test_a_fork_continues_from_the_history_and_resume_reopens_without_replay(
    agent: SharedAgent, tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [{"text": "first answer"}, {"text": "in the fork"}]
    steps: list[dict[str, Any]] = [
        {"op": "new"},
        {"op": "prompt", "text": "question one"},
        {"op": "fork"},
        {"op": "prompt", "text": "question two"},
        {"op": "resume"},
    ]
    with trio.fail_after(DEADLINE):
        init, new, _, fork, _, resumed = await agent.run(steps, replies)
    caps = init["result"]["agentCapabilities"]["sessionCapabilities"]
    assert "fork" in caps and "resume" in caps
    source, forked = new["result"]["sessionId"], fork["result"]["sessionId"]
    assert forked != source and "modes" in fork["result"]
    assert [m["content"] for m in await messages(agent.db, source)] == [
        "question one", "first answer"
    ]  # fmt: skip
    assert [m["content"] for m in await messages(agent.db, forked)] == [
        "question one", "first answer", "question two", "in the fork"
    ]  # fmt: skip
    assert "error" not in resumed and "modes" in resumed["result"]
    assert "user_message_chunk" not in kinds(resumed)


async def test_bad_input_gets_errors_naming_the_problem_and_the_agent_goes_on(
    agent: SharedAgent, tmp_path: Path
) -> None:
    steps: list[dict[str, Any]] = [
        {"op": "raw", "method": "session/teleport", "params": {}},
        {"op": "raw", "method": "session/new", "params": {"cwd": 7}},
        {"op": "raw", "method": "session/new", "params": {"cwd": "relative/dir", "mcpServers": []}},
        {
            "op": "raw",
            "method": "session/prompt",
            "params": {"sessionId": "s-nobody", "prompt": [{"type": "text", "text": "hi"}]},
        },
        {"op": "new"},
        {
            "op": "raw",
            "method": "session/prompt",
            "params": {
                "sessionId": "SID",
                "prompt": [{"type": "image", "data": "", "mimeType": "image/png"}],
            },
        },
        {
            "op": "raw",
            "method": "session/prompt",
            "params": {"sessionId": "SID", "prompt": [{"type": "text", "text": "x" * 1_000_000}]},
        },
        {"op": "prompt", "text": "still there?"},
        {
            "op": "new",
            "mcp": [{"name": "broken", "command": "/nonexistent/mcp", "args": [], "env": []}],
        },
    ]
    with trio.fail_after(DEADLINE):
        _, unknown, typed, relative, nobody, _, image, big, last, broken = await agent.run(
            steps, [{"text": "yes"}]
        )
    assert unknown["error"]["code"] == -32601 and "session/teleport" in unknown["error"]["message"]
    assert typed["error"]["code"] == -32602 and "cwd" in typed["error"]["message"]
    assert relative["error"]["code"] == -32602 and "absolute" in relative["error"]["message"]
    assert nobody["error"]["code"] == -32002 and "s-nobody" in nobody["error"]["message"]
    assert image["error"]["code"] == -32602 and "image" in image["error"]["message"]
    assert big["error"]["code"] == -32602
    assert big["error"]["message"].startswith("prompt: 1000000 bytes, more than 900000")
    assert last["result"]["stopReason"] == "end_turn" and said(last) == "yes"
    assert broken["error"]["code"] == -32602
    assert broken["error"]["message"].startswith("mcpServers: could not start editor-broken: ")


async def test_through_a_running_daemon_the_session_is_the_daemons(
    env: dict[str, str], tmp_path: Path
) -> None:
    async with fake_llm_here([{"text": "from the daemon"}]) as llm:
        with trio.fail_after(DEADLINE):
            async with navi_forks.serving(env, llm, warm=ACP_WARM) as daemon:
                _, new, prompt = await sdk_client(
                    env,
                    tmp_path,
                    [{"op": "new"}, {"op": "prompt", "text": "hi"}],
                    "--url",
                    daemon.url,
                )
                daemon_log = await daemon.stderr.receive_some(1 << 20)
    assert said(prompt) == "from the daemon"
    sid = new["result"]["sessionId"]
    assert f"session {sid}: run started".encode() in daemon_log  # the daemon ran it
    saved = await messages(tmp_path / "navi.db", new["result"]["sessionId"])
    assert [m["content"] for m in saved] == ["hi", "from the daemon"]


async def new_user(env: dict[str, str], name: str) -> str:
    """A user written to the store of `env`, as `navi users add` writes one (that
    command's own test: test_api_daemon's): their token."""
    token = new_token()
    async with SQLiteStore.open(Path(env["NAVI_DB"])) as store:
        await store.create_user(name, token, "user")
    return token


def set_roots(
    config: Path, roots: dict[str, list[str]], general_modes: dict[str, str] | None = None
) -> None:
    """The config with `roots` as its workspace_roots (and the general profile's policy
    modes)."""
    cfg = json.loads(config.read_text(encoding="utf-8"))
    cfg["workspace_roots"] = roots
    if general_modes is not None:
        cfg["profiles"]["general"]["policy"] = {"modes": general_modes}
    config.write_text(json.dumps(cfg), encoding="utf-8")


async def test_a_user_s_cwd_outside_their_roots_is_refused_at_session_new(
    env: dict[str, str], tmp_path: Path
) -> None:
    allowed, outside, data = tmp_path / "allowed", tmp_path / "work", tmp_path / "data"
    allowed.mkdir()
    set_roots(Path(env["NAVI_CONFIG"]), {"user": [str(allowed)]})
    steps: list[dict[str, Any]] = [
        {"op": "new"},
        {"op": "new", "cwd": str(data)},
        {"op": "new", "cwd": str(tmp_path / "err.log")},
        {"op": "new", "cwd": str(allowed)},
        {"op": "prompt", "text": "hi"},
        {"op": "set_mode", "mode": "full"},
    ]
    async with fake_llm_here([{"text": "in the root"}]) as llm:
        with trio.fail_after(DEADLINE):
            async with navi_forks.serving(env, llm, warm=ACP_WARM) as daemon:
                token = await new_user(env, "ann")
                _, out, in_data, a_file, new, prompt, full = await sdk_client(
                    env, tmp_path, steps, "--url", daemon.url, "--token", token
                )
    for refused, where in ((out, outside), (in_data, data)):
        assert refused["error"]["code"] == -32602, refused
        assert str(where) in refused["error"]["message"]
        assert "forbidden" in refused["error"]["message"]
    assert "workspace_roots.user" in out["error"]["message"]
    assert "navi's own data" in in_data["error"]["message"]
    assert a_file["error"]["code"] == -32602 and "not a folder" in a_file["error"]["message"]
    assert [m["id"] for m in new["result"]["modes"]["availableModes"]] == [
        "read-only", "workspace"
    ]  # fmt: skip
    assert said(prompt) == "in the root"
    assert full["error"]["code"] == -32602 and "full" in full["error"]["message"]
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        rows = await store.list_sessions(None)
    assert [r.id for r in rows] == [new["result"]["sessionId"]]  # no session for a refusal


async def test_the_editor_sees_the_mode_navi_clamped_to_and_the_profile_the_agent_chose(
    env: dict[str, str], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    config = Path(env["NAVI_CONFIG"])
    set_roots(config, {"user": [str(work)]}, general_modes={"user": "read-only"})
    switch = {"name": "switch_profile", "arguments": {"profile_id": "coder"}}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [switch]}, {"text": "coding now"}
    ]  # fmt: skip
    steps: list[dict[str, Any]] = [
        {"op": "new"},
        {"op": "prompt", "text": "switch"},
        {"op": "prompt", "text": "again"},
    ]
    async with fake_llm_here(replies) as llm:
        with trio.fail_after(DEADLINE):
            async with navi_forks.serving(env, llm, warm=ACP_WARM) as daemon:
                token = await new_user(env, "ann")
                _, new, first, second = await sdk_client(
                    env, tmp_path, steps, "--url", daemon.url, "--token", token
                )
    assert new["result"]["modes"]["currentModeId"] == "workspace"
    assert [u["currentModeId"] for u in first["updates"] if "currentModeId" in u] == ["read-only"]
    (switched,) = [u for u in first["updates"] if u["sessionUpdate"] == "config_option_update"]
    assert switched["configOptions"][0]["currentValue"] == "coder"
    assert said(first) == "coding now"
    assert second["result"]["stopReason"] == "end_turn"
    assert "config_option_update" not in kinds(second)
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        row = await store.get_session(new["result"]["sessionId"])
    assert row is not None and row.profile_id == "coder"  # the next prompt kept it


@asynccontextmanager
async def editor_server(transport: str, events: ServerEvents) -> AsyncIterator[dict[str, Any]]:
    """The demo MCP server as an editor passes it at session/new (ACP's shape); over
    stdio its hand-written stand-in, which starts at once (the subject is the agent)."""
    if transport == "stdio":
        yield {"name": "demo", "command": sys.executable, "args": ["-S", str(PLAIN)], "env": []}
    else:
        async with http_server(events) as url:
            yield {"type": "http", "name": "demo", "url": url, "headers": []}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_mcp_server_of_session_new_runs_here_and_serves_that_session_alone(
    agent: SharedAgent, tmp_path: Path, transport: str
) -> None:
    echo = {"name": "mcp__editor-demo__echo", "arguments": {"text": "hi"}}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [echo]}, {"text": "it echoed"},
        {"tool_calls": [echo]}, {"text": "no such tool"},
    ]  # fmt: skip
    events = ServerEvents()
    async with editor_server(transport, events) as demo:
        steps: list[dict[str, Any]] = [
            {"op": "new", "mcp": [demo]},
            {"op": "prompt", "text": "echo hi", "permission": "allow_once"},
            {"op": "new"},
            {"op": "prompt", "text": "echo hi here", "permission": "allow_once"},
        ]
        with trio.fail_after(DEADLINE):
            init, _, with_demo, _, without = await agent.run(steps, replies)
    assert init["result"]["agentCapabilities"]["mcpCapabilities"]["http"] is True
    (asked,) = with_demo["permissions"]  # an MCP tool asks, as the daemon's own do
    assert asked["toolCall"]["title"] == "mcp__editor-demo__echo"
    (done,) = [u for u in with_demo["updates"] if u.get("status") == "completed"]
    assert done["rawOutput"] == {"ok": True, "output": "echo: hi"}
    assert said(with_demo) == "it echoed"
    assert without["permissions"] == []
    (failed,) = [u for u in without["updates"] if u.get("status") == "failed"]
    assert "mcp__editor-demo__echo" in failed["rawOutput"]["output"]
    if transport == "http":  # the server's own log: called once, by the first session
        assert events.lines == ["echo hi"]


async def test_stdin_closed_mid_run_stops_it_and_exits_0(
    env: dict[str, str], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/new",
            "params": {"cwd": str(work), "mcpServers": []},
        },
    ]
    async with fake_llm_here([{"text": "partial answer", "stall": True}]) as llm:
        with trio.fail_after(DEADLINE):
            agent = await trio.to_thread.run_sync(navi_command, "acp", "--llm-url", llm)
            proc = await trio.lowlevel.open_process(
                agent,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            assert proc.stdin is not None and proc.stdout is not None
            out = Lines(proc.stdout)
            await proc.stdin.send_all("".join(json.dumps(m) + "\n" for m in lines).encode())
            sid = (await out.until(lambda m: m.get("id") == 2))["result"]["sessionId"]
            prompt = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]},
            }
            await proc.stdin.send_all((json.dumps(prompt) + "\n").encode())
            await out.until(
                lambda m: (
                    m.get("params", {}).get("update", {}).get("sessionUpdate")
                    == "agent_message_chunk"
                )
            )
            await proc.stdin.aclose()
            answer = await out.until(lambda m: m.get("id") == 3)
            assert await proc.wait() == 0
    assert answer["result"]["stopReason"] == "cancelled"
    saved = await messages(tmp_path / "navi.db", sid)
    assert [m["role"] for m in saved] == ["user", "assistant"]


async def test_a_line_that_is_not_json_is_an_error_and_the_agent_goes_on(
    env: dict[str, str], tmp_path: Path
) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    lines = b'{"jsonrpc": "2.0", "id": 7, "meth\n[1, 2]\n' + (json.dumps(init) + "\n").encode()
    with trio.fail_after(DEADLINE):
        agent = await trio.to_thread.run_sync(
            navi_command, "acp", "--llm-url", "http://127.0.0.1:9"
        )
        done = await trio.run_process(
            agent, stdin=lines, capture_stdout=True,
            capture_stderr=True, env=env,
        )  # fmt: skip
    replies = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r.get("error", {}).get("code") for r in replies] == [-32700, -32600, None]
    assert "not JSON" in replies[0]["error"]["message"] and replies[0]["id"] is None
    assert replies[2]["result"]["protocolVersion"] == 1


async def test_sigterm_ends_the_agent_as_a_closed_stdin_does(
    env: dict[str, str], tmp_path: Path
) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    async with fake_llm_here([{"text": "hi"}]) as llm:
        with trio.fail_after(DEADLINE):
            agent = await trio.to_thread.run_sync(navi_command, "acp", "--llm-url", llm)
            proc = await trio.lowlevel.open_process(
                agent, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env,
            )  # fmt: skip
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            await proc.stdin.send_all((json.dumps(init) + "\n").encode())
            await Lines(proc.stdout).until(lambda m: m.get("id") == 1)
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
            err = await proc.stderr.receive_some(1 << 20)
    assert b"Traceback" not in err and b"error" not in err, err


def editor_snippets() -> list[tuple[str, list[str]]]:
    """(editor, argv) of each configuration snippet of docs/pages/editors.md."""
    page = Path(__file__).parent.parent / "docs" / "pages" / "editors.md"
    section = page.read_text(encoding="utf-8")
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```json\n(.*?)```", section, re.S):
        for name, server in json.loads(block)["agent_servers"].items():
            found.append((f"json {name}", [server["command"], *server["args"]]))
    (lua,) = re.findall(r"```lua\n(.*?)```", section, re.S)
    (default,) = re.findall(r"default = \{ (.*?) \}", lua)
    found.append(("lua", [json.loads(w) for w in default.split(", ")]))
    return found


async def test_each_editor_snippet_of_the_docs_starts_an_agent_that_answers(
    env: dict[str, str], tmp_path: Path
) -> None:
    snippets = editor_snippets()
    assert len(snippets) == 3
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    async with fake_llm_here([{"text": "hi"}]) as llm:
        for _, argv in snippets:
            assert argv[0] == "navi"  # as the editor starts it, with this venv's navi
            command = await trio.to_thread.run_sync(
                partial(navi_command, *argv[1:], "--llm-url", llm)
            )
            with trio.fail_after(DEADLINE):
                done = await trio.run_process(
                    command, stdin=(json.dumps(init) + "\n").encode(), capture_stdout=True,
                    capture_stderr=True, env=env,
                )  # fmt: skip
            (reply,) = [json.loads(line) for line in done.stdout.decode().splitlines()]
            assert reply["result"]["protocolVersion"] == 1, argv
