"""`navi acp` driven by `acpx`, the headless ACP client from the npm registry.

acpx (node) spawns ``python -m navi_trio acp`` as its agent, runs one prompt (``exec``)
and, with ``--format json``, prints every JSON-RPC message of the session: what the
tests assert on, with the files the run left. It comes from `.acpx/` in the checkout
(``npm install --prefix .acpx acpx@0.19.1``, as .ci/run does), else from PATH; without
it these tests skip, saying why.

Rules: loopback only, port 0, real processes, an absolute deadline on every test.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from daemons import no_plan_config
from test_acp_updates import valid
from test_cli import fake_llm

pytestmark = pytest.mark.slow
DEADLINE = 90
LOCAL_ACPX = Path(__file__).parent.parent / ".acpx" / "node_modules" / ".bin" / "acpx"


def acpx() -> str:
    found = str(LOCAL_ACPX) if LOCAL_ACPX.exists() else shutil.which("acpx")
    if found is None or shutil.which("node") is None:
        pytest.skip("acpx is not installed: `npm install --prefix .acpx acpx@0.19.1` (node 20+)")
    return found


async def acpx_exec(
    env: dict[str, str], tmp_path: Path, llm: str, prompt: str, *options: str,
    agent_args: tuple[str, ...] = (),
) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """acpx's JSON-RPC log of one ``exec`` against `navi acp`, and its exit code."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    agent = " ".join([sys.executable, "-m", "navi_trio", "acp", "--llm-url", llm, *agent_args])
    env = {**env, "HOME": str(home), "NAVI_CONFIG": str(no_plan_config(tmp_path))}
    done = await trio.run_process(
        [acpx(), "--format", "json", "--cwd", str(work), "--agent", agent, *options,
         "exec", prompt],
        capture_stdout=True, capture_stderr=True, check=False, env=env,
    )  # fmt: skip
    log = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    assert log, done.stderr.decode()[-2000:]
    for message in log:
        agents(message)
    return log, done.returncode


def agents(message: dict[str, Any]) -> None:
    """What the agent sent, checked against the protocol's published schema."""
    assert message["jsonrpc"] == "2.0"
    method, result = message.get("method"), message.get("result")
    if method == "session/update":
        valid("SessionNotification", message["params"])
    elif method == "session/request_permission":
        valid("RequestPermissionRequest", message["params"])
    elif isinstance(result, dict) and "protocolVersion" in result:
        valid("InitializeResponse", result)
    elif isinstance(result, dict) and "modes" in result:
        valid("NewSessionResponse", result)
    elif isinstance(result, dict) and "stopReason" in result:
        valid("PromptResponse", result)


def updates(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["params"]["update"] for m in log if m.get("method") == "session/update"]


def answer(log: list[dict[str, Any]]) -> dict[str, Any]:
    (prompt,) = [m for m in log if m.get("method") == "session/prompt"]
    (reply,) = [
        m for m in log if m.get("id") == prompt["id"] and "stopReason" in m.get("result", {})
    ]
    return reply


async def test_acpx_streams_the_answer_and_an_edit_with_its_diff(
    env: dict[str, str], tmp_path: Path
) -> None:
    write = {"name": "filesystem",
             "arguments": {"action": "write", "path": "b.txt", "content": "hi\n"}}  # fmt: skip
    replies: list[dict[str, Any]] = [
        {"text": "Writing.", "tool_calls": [write]},
        {"text": "Done writing"},
    ]
    async with fake_llm(tmp_path, replies) as llm:
        with trio.fail_after(DEADLINE):
            log, code = await acpx_exec(env, tmp_path, llm, "write b", "--approve-all")
    assert code == 0
    assert answer(log)["result"]["stopReason"] == "end_turn"
    got = updates(log)
    text = "".join(u["content"]["text"] for u in got if u["sessionUpdate"] == "agent_message_chunk")
    assert text == "Writing.Done writing"
    (start,) = [u for u in got if u["sessionUpdate"] == "tool_call"]
    assert start["kind"] == "edit"
    calls = [u for u in got if u["sessionUpdate"] == "tool_call_update"]
    diffs = [c for u in calls for c in u.get("content") or [] if c["type"] == "diff"]
    target = str(tmp_path / "work" / "b.txt")
    assert diffs == [{"type": "diff", "path": target, "oldText": None, "newText": "hi\n"}]
    assert (tmp_path / "work" / "b.txt").read_text() == "hi\n"  # noqa: ASYNC240


@pytest.mark.parametrize(("policy", "runs"), [("--approve-all", True), ("--deny-all", False)])
async def test_acpx_answers_the_permission_request(
    env: dict[str, str], tmp_path: Path, policy: str, runs: bool
) -> None:
    marker = tmp_path / "ran"
    touch = {"name": "terminal", "arguments": {"action": "run", "command": f"touch {marker}"}}
    replies: list[dict[str, Any]] = [{"text": "", "tool_calls": [touch]}, {"text": "over"}]
    async with fake_llm(tmp_path, replies) as llm:
        with trio.fail_after(DEADLINE):
            log, code = await acpx_exec(
                env, tmp_path, llm, "touch it", policy, agent_args=("--mode", "full")
            )
    assert code == (0 if runs else 5)  # acpx's exit code when it denied a permission
    (asked,) = [m for m in log if m.get("method") == "session/request_permission"]
    assert asked["params"]["toolCall"]["title"] == f"$ touch {marker}"
    # Both sides number their requests: the editor's reply is the one with an outcome.
    (reply,) = [m for m in log if m.get("id") == asked["id"] and "outcome" in m.get("result", {})]
    chosen = reply["result"]["outcome"]
    assert chosen["outcome"] == "selected"
    assert chosen["optionId"].startswith("allow" if runs else "reject")
    assert marker.exists() is runs
    assert answer(log)["result"]["stopReason"] == "end_turn"
