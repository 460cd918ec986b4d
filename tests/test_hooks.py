"""Hooks, end to end: the fake LLM over real HTTP, a real SQLite store, and hook commands
that are small shell scripts each test writes (docs/pages/hooks.md).

Each event fires with its documented stdin; each answer does what it says (allow, deny
with the reason the model reads, modify re-validated, permission_request deciding,
user_message adding context or blocking, pre_compact text kept); exit code 2 blocks
with stderr; a hook that hangs, prints garbage or exits non-zero is an error event and
the event's default; a stop cancels a running hook; a repository's hook file runs only
when trusted by path and hash, read in Claude Code's format.

Rules: real processes (so `slow`), real time bounded by `trio.fail_after`, no sleeps: a
hang is a hook blocked on a FIFO, the stop test learns that its hook runs from another.
Runs are the local admin's in `full` mode (no bwrap here; the hook runs as the tool user).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from navi_trio.profiles import ConfigSource, parse_config
from navi_trio.settings import default_config_path
from navi_trio.testing import open_harness

pytestmark = pytest.mark.slow  # its tests start processes
TIMEOUT = 60
FULL: dict[str, Any] = {"user_role": "admin", "mode": "full"}


ALLOW_TERMINAL = [{"tool": "terminal", "decision": "allow"}]


def config(tmp_path: Path, hooks: dict[str, Any], *, rules: Any = (), **top: Any) -> ConfigSource:
    """The shipped config with `hooks`, the general profile's policy `rules`, and
    `top` keys (hook_files)."""
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["general"]["policy"] = {"rules": list(rules)}
    data["hooks"] = hooks
    data.update(top)
    data["profiles"]["general"]["compression_keep_recent"] = 1
    data["profiles"]["general"]["planning_first_message"] = False
    return ConfigSource(path, initial=parse_config(data, path))


def script(tmp_path: Path, name: str, body: str) -> str:
    """A hook script (a shell file the tool user may run); its command line."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def recorder(tmp_path: Path, answer: str = "") -> str:
    """Appends its stdin (one JSON object) as a line of tmp/record, then prints `answer`."""
    rec = tmp_path / "record"
    name = f"rec-{hashlib.sha256(answer.encode()).hexdigest()[:8]}.sh"
    return script(tmp_path, name, f"cat >> {rec}; echo >> {rec}; printf '%s' '{answer}'")


def recorded(tmp_path: Path) -> list[dict[str, Any]]:
    rec = tmp_path / "record"
    if not rec.exists():
        return []
    return [json.loads(line) for line in rec.read_text().splitlines() if line.strip()]


def run(command: str) -> dict[str, Any]:
    return {
        "tool_calls": [{"name": "terminal", "arguments": {"action": "run", "command": command}}]
    }


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def of_type(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == kind]


async def one_call(
    tmp_path: Path, source: ConfigSource, command: str, **message: Any
) -> tuple[list[dict[str, Any]], str]:
    """A turn whose model runs `command` with the terminal, then answers: its frames
    and the tool result the model read."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[run(command), {"text": "ok"}], config=source
        ) as h:
            frames = await h.turn("s1", "go", **message, **FULL)
            (result,) = tool_results(h.chat_requests[1])
    return frames, result


async def test_each_event_fires_with_its_stdin_and_permission_request_decides(
    tmp_path: Path,
) -> None:
    rec = recorder(tmp_path)
    allow = recorder(tmp_path, '{"decision": "allow"}')
    hooks: dict[str, list[dict[str, Any]]] = {
        e: [{"command": rec}]
        for e in ("session_start", "user_message", "pre_tool", "post_tool", "turn_end")
    }
    # terminal asks in full mode: the hook answers, no person is there to.
    hooks["permission_request"] = [{"command": allow, "matcher": {"tool": "terminal"}}]
    marker = tmp_path / "ran"
    replies = [run(f"touch {marker}; echo hi"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, config=config(tmp_path, hooks)) as h:
            frames = await h.turn("s1", "please run it", **FULL)
            await (await h.session("s1")).idle()  # turn_end runs after the stream's end
    assert frames[-1]["reason"] == "complete" and marker.exists(), frames
    seen = recorded(tmp_path)
    events = [s["event"] for s in seen]
    assert events == [
        "session_start", "user_message", "pre_tool", "permission_request", "post_tool",
        "turn_end",
    ]  # fmt: skip
    assert all(s["session"] == "s1" and s["user"] == "local" for s in seen)
    assert seen[1]["message"] == "please run it"
    assert seen[2]["tool"] == "terminal" and "touch" in seen[2]["arguments"]["command"]
    assert "result" not in seen[2]
    assert "mode full" in seen[3]["rule"], seen[3]["rule"]
    assert seen[4]["result"]["ok"] is True and "hi" in seen[4]["result"]["output"]
    assert seen[5]["reason"] == "complete" and seen[5]["text"] == "done"


async def test_a_pre_tool_deny_is_the_reason_the_model_reads(tmp_path: Path) -> None:
    deny = recorder(tmp_path, '{"decision": "deny", "reason": "no touching on Sundays"}')
    hooks = {"pre_tool": [{"command": deny, "matcher": {"tool": "terminal", "match": "touch*"}}]}
    marker = tmp_path / "ran"
    _, result = await one_call(tmp_path, config(tmp_path, hooks), f"touch {marker}")
    assert "no touching on Sundays" in result and "not run" in result
    assert not marker.exists()


async def test_a_matcher_that_does_not_match_leaves_the_call_alone(tmp_path: Path) -> None:
    deny = recorder(tmp_path, '{"decision": "deny", "reason": "no"}')
    hooks = {"pre_tool": [{"command": deny, "matcher": {"tool": "terminal", "match": "rm *"}}]}
    marker = tmp_path / "ran"
    await one_call(tmp_path, config(tmp_path, hooks, rules=ALLOW_TERMINAL), f"touch {marker}")
    assert recorded(tmp_path) == [] and marker.exists()


async def test_a_modify_that_breaks_the_tool_schema_is_refused(tmp_path: Path) -> None:
    answer = json.dumps({"decision": "modify", "arguments": {"action": "run", "command": 3}})
    hooks = {"pre_tool": [{"command": recorder(tmp_path, answer)}]}
    marker = tmp_path / "ran"
    source = config(tmp_path, hooks, rules=ALLOW_TERMINAL)
    _, result = await one_call(tmp_path, source, f"touch {marker}")
    assert "does not take" in result and "argument 'command': 3 is not of type" in result
    assert not marker.exists()


async def test_a_modified_call_runs_with_its_new_arguments(tmp_path: Path) -> None:
    changed = tmp_path / "changed"
    answer = json.dumps(
        {"decision": "modify", "arguments": {"action": "run", "command": f"touch {changed}"}}
    )
    hooks = {"pre_tool": [{"command": recorder(tmp_path, answer)}]}
    marker = tmp_path / "ran"
    await one_call(tmp_path, config(tmp_path, hooks, rules=ALLOW_TERMINAL), f"touch {marker}")
    assert changed.exists() and not marker.exists()


async def test_exit_code_2_blocks_with_stderr_as_the_reason(tmp_path: Path) -> None:
    block = script(
        tmp_path, "block.sh", "cat > /dev/null; echo 'pushes wait for review' >&2; exit 2"
    )
    hooks = {"pre_tool": [{"command": block}]}
    _, result = await one_call(tmp_path, config(tmp_path, hooks), "echo x")
    assert "pushes wait for review" in result


@pytest.mark.parametrize(
    ("body", "limit", "words"),
    [
        # A hook that answers gets the default limit: on a loaded machine its start alone
        # can take longer than a second, and it would fail as a hang instead.
        ("cat > /dev/null; echo 'this is not json'", None, "not JSON"),
        ("cat > /dev/null; echo oops >&2; exit 1", None, "exited with code 1: oops"),
        ("cat {fifo}", 1, "no answer within 1 s"),  # blocked on a FIFO nobody writes
    ],
)
async def test_a_failing_pre_tool_hook_is_an_error_and_denies(
    tmp_path: Path, body: str, limit: int | None, words: str
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bad = script(tmp_path, "bad.sh", body.format(fifo=fifo))
    hook: dict[str, Any] = {"command": bad}
    if limit is not None:
        hook["timeout_sec"] = limit
    hooks = {"pre_tool": [hook]}
    marker = tmp_path / "ran"
    source = config(tmp_path, hooks, rules=ALLOW_TERMINAL)
    frames, result = await one_call(tmp_path, source, f"touch {marker}")
    (error,) = of_type(frames, "error")
    assert error["code"] == "hook_failed" and words in error["message"]
    assert "the call is denied" in error["message"]
    assert "a pre_tool hook failed" in result and not marker.exists()
    assert frames[-1]["reason"] == "complete"


async def test_a_failing_post_tool_hook_is_an_error_and_ignored(tmp_path: Path) -> None:
    bad = script(tmp_path, "bad.sh", "cat > /dev/null; exit 3")
    hooks = {"post_tool": [{"command": bad}]}
    source = config(tmp_path, hooks, rules=ALLOW_TERMINAL)
    frames, result = await one_call(tmp_path, source, "echo fine")
    (error,) = of_type(frames, "error")
    assert "exited with code 3" in error["message"] and "ignored" in error["message"]
    assert "fine" in result and "[exit code 0]" in result


async def test_a_stop_cancels_a_running_hook_at_once(tmp_path: Path) -> None:
    started, held = tmp_path / "started", tmp_path / "held"
    os.mkfifo(started)
    os.mkfifo(held)
    slow = script(tmp_path, "slow.sh", f"cat > /dev/null; echo go > {started}; cat {held}")
    rec = recorder(tmp_path)
    hooks = {
        "pre_tool": [{"command": slow, "timeout_sec": 600}],
        "stop": [{"command": rec}],
        "turn_end": [{"command": rec}],
    }
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[run("echo x"), {"text": "never"}], config=config(tmp_path, hooks)
        ) as h:
            s = await h.session("s1")
            s.send("go", **FULL)

            def wait_started() -> str:
                with open(started, encoding="ascii") as f:
                    return f.read()

            assert await trio.to_thread.run_sync(wait_started, abandon_on_cancel=True) == "go\n"
            with trio.fail_after(10):  # not the hook's 600 s
                s.stop()
                frames = await s.until_end()
            await s.idle()
    assert frames[-1]["stopped"] is True
    seen = recorded(tmp_path)
    assert [r["event"] for r in seen] == ["stop", "turn_end"]
    assert seen[1]["reason"] == "stopped"


async def test_subagent_end_and_task_done_fire_with_their_stdin(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    hooks = {"subagent_end": [{"command": rec}], "task_done": [{"command": rec}]}
    background = {"action": "run", "command": "echo from the job", "background": True}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "spawn_agent", "arguments": {"task": "say hi"}}]},
        {"text": "sub done"},  # the sub-agent's answer
        {"tool_calls": [{"name": "terminal", "arguments": background}]},
        {"text": "all done"},
    ]
    source = config(tmp_path, hooks, rules=ALLOW_TERMINAL)
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, config=source) as h:
            await h.turn("s1", "go", **FULL)
            (job,) = h.runtime.supervisor.list_jobs("s1")
            await job.done.wait()
            await (await h.session("s1")).idle()
    by_event = {r["event"]: r for r in recorded(tmp_path)}
    assert set(by_event) == {"subagent_end", "task_done"}
    assert by_event["subagent_end"]["reason"] == "complete"
    assert by_event["subagent_end"]["text"] == "sub done"
    done = by_event["task_done"]
    assert done["task_id"] == job.task_id and done["tool"] == "terminal"
    assert done["result"]["ok"] is True and "from the job" in done["result"]["output"]


async def test_user_message_hooks_add_context_or_block(tmp_path: Path) -> None:
    add = recorder(tmp_path, '{"context": "the build server is down today"}')
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[{"text": "noted"}],
            config=config(tmp_path, {"user_message": [{"command": add}]}),
        ) as h:  # fmt: skip
            await h.turn("s1", "hello", **FULL)
            sent = json.dumps(h.chat_requests[0]["messages"])
    assert "the build server is down today" in sent

    block = recorder(tmp_path, '{"decision": "block", "reason": "secrets in the message"}')
    second = tmp_path / "second"
    second.mkdir()
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            second,
            replies=[{"text": "never"}],
            config=config(tmp_path, {"user_message": [{"command": block}]}),
        ) as h:
            frames = await h.turn("s1", "my key is x", **FULL)
            assert h.chat_requests == []
    assert frames[-1]["reason"] == "blocked" and "secrets in the message" in frames[-1]["text"]


async def test_pre_compact_text_is_kept_in_the_summary(tmp_path: Path) -> None:
    # A compaction runs in the workspace sandbox, where the test's folder is not seen:
    # the hook is a command line of its own.
    keep = """cat > /dev/null; echo '{"context": "KEEP-ME-42: the deploy key lives in vault"}'"""
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[{"text": "a short summary"}],
            config=config(tmp_path, {"pre_compact": [{"command": keep}]}),
        ) as h:  # fmt: skip
            await h.runtime.store.create_session("s1", profile_id="general")
            older = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
                for i in range(6)
            ]
            await h.runtime.store.append("s1", messages=older, context=older)
            s = await h.session("s1")
            s.compact()
            frames = await s.until_type("context_compressed")
            await s.idle()
            context = await h.runtime.store.load_context("s1")
            prompt = json.dumps(h.chat_requests[0]["messages"])
    assert of_type(frames, "error") == []
    summary = [m["content"] for m in context if m.get("summary")]
    assert len(summary) == 1 and "KEEP-ME-42" in summary[0]
    assert "KEEP-ME-42" in prompt


def claude_file(repo: Path, command: str) -> bytes:
    folder = repo / ".claude"
    folder.mkdir(parents=True)
    data = {
        "permissions": {"allow": []},
        "hooks": {
            "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": command}]}],
            "Notification": [{"hooks": [{"type": "command", "command": "false"}]}],
        },
    }
    text = json.dumps(data).encode()
    (folder / "settings.json").write_bytes(text)
    return text


@pytest.mark.parametrize("trusted", [False, True])
async def test_a_repository_hook_file_runs_only_when_trusted(tmp_path: Path, trusted: bool) -> None:
    answer = json.dumps(
        {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": "the repo says no",
            }
        }
    )
    repo = tmp_path / "repo"
    text = claude_file(repo, recorder(tmp_path, answer))
    entry = {"path": str(repo / ".claude" / "settings.json"),
             "sha256": hashlib.sha256(text).hexdigest()}  # fmt: skip
    files = {"read": ["claude"], "trusted": [entry] if trusted else []}
    marker = tmp_path / "ran"
    source = config(tmp_path, {}, rules=ALLOW_TERMINAL, hook_files=files)
    frames, result = await one_call(tmp_path, source, f"touch {marker}", cwd=repo)
    warnings = [f for f in of_type(frames, "warning") if f["code"] == "hook_file_untrusted"]
    if not trusted:
        assert recorded(tmp_path) == [] and marker.exists()
        (warning,) = warnings
        assert entry["path"] in warning["message"] and entry["sha256"] in warning["message"]
        return
    assert warnings == [] and not marker.exists() and "the repo says no" in result
    (seen,) = recorded(tmp_path)
    assert seen["hook_event_name"] == "PreToolUse" and seen["tool_name"] == "Bash"
    assert seen["tool_input"]["command"] == f"touch {marker}"


async def test_a_changed_hook_file_is_no_longer_trusted(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    text = claude_file(repo, recorder(tmp_path))
    path = repo / ".claude" / "settings.json"
    entry = {"path": str(path), "sha256": hashlib.sha256(text).hexdigest()}
    path.write_bytes(text.replace(b"Bash", b"Bash|Write"))
    files = {"read": ["claude"], "trusted": [entry]}
    source = config(tmp_path, {}, rules=ALLOW_TERMINAL, hook_files=files)
    frames, _ = await one_call(tmp_path, source, "echo x", cwd=repo)
    assert [f["code"] for f in of_type(frames, "warning")].count("hook_file_untrusted") == 1
    assert recorded(tmp_path) == []


async def test_a_hook_reads_a_long_result_cut_to_its_bound(tmp_path: Path) -> None:
    hooks = {"post_tool": [{"command": recorder(tmp_path)}]}
    source = config(tmp_path, hooks, rules=ALLOW_TERMINAL)
    frames, _ = await one_call(tmp_path, source, "yes x | head -c 30000")
    seen_all = recorded(tmp_path)
    assert len(seen_all) == 1, [f for f in frames if f["type"] in ("error", "warning")]
    (seen,) = seen_all
    output = seen["result"]["output"]
    assert output.startswith("x\nx\n") and output.endswith("characters cut]")
    assert len(output) < 8100


async def test_a_hook_answer_over_its_bound_is_a_failed_hook(tmp_path: Path) -> None:
    # Well-formed JSON, but more than a hook may say (64 KiB): a failed hook, so the call
    # is denied, and the error names the bound.
    padding = "x" * 70_000
    body = f"""cat > /dev/null; printf '{{"decision": "allow", "context": "{padding}"}}'"""
    hooks = {"pre_tool": [{"command": script(tmp_path, "long.sh", body)}]}
    marker = tmp_path / "ran"
    source = config(tmp_path, hooks, rules=ALLOW_TERMINAL)
    frames, result = await one_call(tmp_path, source, f"touch {marker}")
    (error,) = of_type(frames, "error")
    assert error["code"] == "hook_failed", error
    assert "over 65536 characters" in error["message"], error
    assert "a pre_tool hook failed" in result and not marker.exists()


def trusted_files(path: Path, text: bytes) -> dict[str, Any]:
    entry = {"path": str(path), "sha256": hashlib.sha256(text).hexdigest()}
    return {"read": ["claude"], "trusted": [entry]}


@pytest.mark.parametrize("linked", ["file", "folder"])
async def test_a_hook_file_reached_through_a_link_is_not_read(tmp_path: Path, linked: str) -> None:
    # The hook file, or its folder, is a link to one elsewhere whose content the admin
    # trusts at that path: read only without following a link, so nothing of it runs.
    elsewhere = tmp_path / "elsewhere"
    text = claude_file(elsewhere, recorder(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    if linked == "file":
        (repo / ".claude").mkdir()
        (repo / ".claude" / "settings.json").symlink_to(elsewhere / ".claude" / "settings.json")
    else:
        (repo / ".claude").symlink_to(elsewhere / ".claude")
    files = trusted_files(repo / ".claude" / "settings.json", text)
    source = config(tmp_path, {}, rules=ALLOW_TERMINAL, hook_files=files)
    frames, _ = await one_call(tmp_path, source, "echo x", cwd=repo)
    (warning,) = [f for f in of_type(frames, "warning") if f["code"] == "hook_file_untrusted"]
    assert "cannot be read" in warning["message"], warning
    assert recorded(tmp_path) == []


async def test_a_hook_file_over_its_bound_is_not_read(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    text = claude_file(repo, recorder(tmp_path))
    path = repo / ".claude" / "settings.json"
    text = text[:-1] + b" " * (256 * 1024 + 1 - len(text)) + text[-1:]
    path.write_bytes(text)
    source = config(tmp_path, {}, rules=ALLOW_TERMINAL, hook_files=trusted_files(path, text))
    frames, _ = await one_call(tmp_path, source, "echo x", cwd=repo)
    (warning,) = [f for f in of_type(frames, "warning") if f["code"] == "hook_file_untrusted"]
    assert f"larger than {256 * 1024} bytes" in warning["message"], warning
    assert recorded(tmp_path) == []
