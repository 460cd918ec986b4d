"""The ``hooks`` and ``hook_files`` keys of config.json are checked as strictly as the rest
(a bad entry names the file and the key); the answers of hooks in both dialects are
read as documented; a Claude Code hook file maps its events and tool names to ours.
No process is started here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from navi_trio.core.turn.hook_answers import HookAnswer, HookFailed, claude_answer, navi_answer
from navi_trio.core.turn.hook_files import Hook, parse_claude
from navi_trio.core.turn.hooks import STDIN_MAX_BYTES, TurnHooks, _bounded
from navi_trio.core.turn.policy import CallFacts
from navi_trio.errors import ConfigError
from navi_trio.profiles import CallPattern, HookConfig, parse_config
from navi_trio.settings import default_config_path
from navi_trio.tools.base import ToolContext


def _parse(**top: Any) -> Any:
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(top)
    return parse_config(data, path)


def test_a_hook_entry_parses_with_its_matcher() -> None:
    cfg = _parse(
        hooks={
            "pre_tool": [{"command": "check", "matcher": {"tool": "terminal", "match": "git *"}}],
            "turn_end": [{"command": "notify", "timeout_sec": 5}],
        }
    )
    (pre,) = cfg.hooks["pre_tool"]
    assert pre == HookConfig(
        command="check", matcher=CallPattern(tool="terminal", match="git *"), timeout_sec=30.0
    )
    assert cfg.hooks["turn_end"][0].timeout_sec == 5


@pytest.mark.parametrize(
    ("top", "words"),
    [
        ({"hooks": {"pre_tol": []}}, "$.hooks['pre_tol']: unknown event"),
        ({"hooks": {"pre_tool": "check"}}, "$.hooks['pre_tool']: expected a list of objects"),
        ({"hooks": {"pre_tool": ["check"]}}, "$.hooks['pre_tool'][0]: expected an object"),
        ({"hooks": []}, "$.hooks: expected an object"),
        ({"hooks": {"pre_tool": [{"command": ""}]}}, "command: expected a command line"),
        ({"hooks": {"pre_tool": [{}]}}, "$.hooks['pre_tool'][0].command"),
        ({"hooks": {"pre_tool": [{"command": "x", "timeout_sec": 0}]}}, "timeout_sec"),
        ({"hooks": {"pre_tool": [{"command": "x", "timeout_sec": 601}]}}, "at most 600"),
        ({"hooks": {"pre_tool": [{"command": "x", "when": 1}]}}, "extra fields found (when)"),
        ({"hooks": {"stop": [{"command": "x", "matcher": {"tool": "t"}}]}}, "only the tool"),
        ({"hooks": {"pre_tool": [{"command": "x", "matcher": "Bash"}]}}, "matcher: expected an"),
        ({"hooks": {"pre_tool": [{"command": "x", "matcher": {"tol": "a"}}]}}, "matcher.tool"),
        ({"hook_files": {"read": ["cursor"]}}, "$.hook_files.read[0]"),
        ({"hook_files": {"read": "claude"}}, "$.hook_files.read: expected a list"),
        ({"hook_files": {"trusted": [{"path": "x", "sha256": "0" * 64}]}}, "absolute path"),
        ({"hook_files": {"trusted": [{"path": "/x", "sha256": "abc"}]}}, "64 lower-case hex"),
    ],
)
def test_a_bad_hooks_entry_names_the_file_and_key(top: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _parse(**top)
    assert str(default_config_path()) in str(err.value)
    assert words in str(err.value)


@pytest.mark.parametrize(
    ("code", "out", "err", "answer"),
    [
        (0, "", "", HookAnswer()),
        (0, '{"decision": "allow"}', "", HookAnswer("allow")),
        (0, '{"decision": "deny", "reason": "r"}', "", HookAnswer("deny", reason="r")),
        (0, '{"context": "c"}', "", HookAnswer(context="c")),
        (
            0,
            '{"decision": "modify", "arguments": {"a": 1}}',
            "",
            HookAnswer("modify", arguments={"a": 1}),
        ),
        (2, "", "why not\n", HookAnswer("block", reason="why not")),
    ],
)
def test_our_answers(code: int, out: str, err: str, answer: HookAnswer) -> None:
    assert navi_answer(code, out, err) == answer


@pytest.mark.parametrize(
    ("code", "out"),
    [
        (0, "garbage"),
        (0, "[1]"),
        (0, '{"decision": "maybe"}'),
        (0, '{"decision": "modify"}'),
        (0, '{"verdict": "allow"}'),
        (1, ""),
    ],
)
def test_an_unreadable_answer_is_a_failed_hook(code: int, out: str) -> None:
    with pytest.raises(HookFailed):
        navi_answer(code, out, "")


def test_claude_answers_map_to_ours() -> None:
    specific = {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                "permissionDecisionReason": "no"}  # fmt: skip
    assert claude_answer(0, json.dumps({"hookSpecificOutput": specific}), "") == HookAnswer(
        "deny", reason="no"
    )
    updated = {"hookSpecificOutput": {"updatedInput": {"command": "ls"}}}
    assert claude_answer(0, json.dumps(updated), "").arguments == {"command": "ls"}
    allow = {"hookSpecificOutput": {"decision": {"behavior": "allow"}}}
    assert claude_answer(0, json.dumps(allow), "").decision == "allow"
    assert claude_answer(0, '{"decision": "block", "reason": "r"}', "").decision == "block"
    assert claude_answer(0, "plain text", "") == HookAnswer(context="plain text")
    assert claude_answer(2, "", "stop").reason == "stop"


def test_a_claude_settings_file_maps_events_and_tools() -> None:
    data = {
        "hooks": {
            "PreToolUse": [
                {"matcher": "Bash|Write", "hooks": [{"type": "command", "command": "a"}]}
            ],
            "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "b", "timeout": 5}]}],
            "Notification": [{"hooks": [{"type": "command", "command": "c"}]}],
        }
    }
    hooks = parse_claude(data, "/repo/.claude/settings.json")
    assert [(h.event, h.matcher.tool, h.matcher.action) for h in hooks] == [
        ("pre_tool", "terminal", "*"),
        ("pre_tool", "filesystem", "write"),
        ("user_message", "*", "*"),
    ]
    assert hooks[2].timeout_sec == 5 and all(h.dialect == "claude" for h in hooks)


def test_the_stdin_of_a_hook_is_bounded_in_bytes() -> None:
    huge = {"event": "post_tool", "arguments": {f"k{i}": "x" * 9000 for i in range(20)}}
    cut = _bounded(huge)
    assert len(json.dumps(cut).encode()) <= STDIN_MAX_BYTES
    assert "truncated" in cut["arguments"]
    small = _bounded({"event": "post_tool", "arguments": {"text": "y" * 9000}})
    assert small["arguments"]["text"].endswith("characters cut]")


async def test_an_event_without_hooks_has_no_opinion_and_looks_at_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool call fires pre_tool and post_tool whatever the config: with no hook for
    the event the answer is no opinion, and neither the call's facts nor its arguments
    are looked at (a hook of another event does not count)."""

    def no_facts(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the call's facts were worked out")

    monkeypatch.setattr(CallFacts, "of", no_facts)
    other = Hook("user_message", "/bin/false", CallPattern(tool="*"), 5.0, "config.json")
    ctx = ToolContext(
        session_id="s",
        session_dir=tmp_path,
        kv=cast(Any, None),
        settings=cast(Any, None),
        profile=cast(Any, None),
        config=cast(Any, None),
    )
    for hooks in (TurnHooks(), TurnHooks((other,))):
        for event in ("pre_tool", "post_tool", "permission_request"):
            answer = await hooks.fire(event, ctx, tool="terminal", arguments={"command": "ls"})
            assert answer == HookAnswer()
