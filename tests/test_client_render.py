"""The chat renderer fed frame sequences, read back from a recording rich Console.

No I/O, no clock: each test builds frames as the daemon sends them and checks the text
a person would see.
"""

from __future__ import annotations

import io
import time
from typing import Any

from rich.console import Console

from navi_trio.client.render import TOOL_TAIL_LINES, Renderer, split_blocks


def _renderer(**kw: Any) -> tuple[Renderer, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None, force_terminal=False)
    return Renderer(console, **kw), out


def _seq(frames: list[dict[str, Any]], session: str = "s-1") -> list[dict[str, Any]]:
    return [
        {"session_id": session, "seq": i + 1, "is_subagent": False, "agent_id": None, **f}
        for i, f in enumerate(frames)
    ]


def _feed(r: Renderer, frames: list[dict[str, Any]]) -> None:
    for frame in _seq(frames):
        r.frame(frame)


def _steps(*statuses: str) -> list[dict[str, Any]]:
    names = ["read the code — TOOL: filesystem", "write the test — SELF", "fix it"]
    return [{"index": i + 1, "text": names[i], "status": s} for i, s in enumerate(statuses)]


def test_the_plan_is_a_checklist_that_ticks_as_todo_steps_finish() -> None:
    r, out = _renderer()
    _feed(
        r,
        [
            {
                "type": "plan",
                "text": "1. read",
                "steps": [
                    {"index": 1, "description": "read the code"},
                    {"index": 2, "description": "write the test"},
                    {"index": 3, "description": "fix it"},
                ],
            },
            # The daemon fills the todo list from the plan: the same steps, all pending.
            {"type": "todo_updated", "steps": _steps("pending", "pending", "pending")},
            {"type": "todo_updated", "steps": _steps("done", "in_progress", "pending")},
            {"type": "todo_updated", "steps": _steps("done", "done", "failed")},
        ],
    )
    text = out.getvalue()
    blocks = text.split("Plan ")
    assert blocks[1].startswith("0/3") and "☐ 1. read the code" in blocks[1]
    assert blocks[2].startswith("1/3")
    assert "✔ 1. read the code" in blocks[2] and "▸ 2. write the test" in blocks[2]
    assert "☐ 3. fix it" in blocks[2]
    assert blocks[3].startswith("2/3") and "✔ 2. write the test" in blocks[3]
    assert "✗ 3. fix it" in blocks[3]
    assert len(blocks) == 4  # the plan filled into the todo list is not shown again
    assert "TOOL:" not in text and "SELF" not in text  # the planner's step tails


def test_a_tool_call_is_a_card_with_status_duration_and_a_bounded_output_tail() -> None:
    r, out = _renderer()
    lines = [f"line {i}" for i in range(TOOL_TAIL_LINES + 3)]
    _feed(
        r,
        [
            {
                "type": "tool_started",
                "call_id": "c1",
                "name": "terminal",
                "arguments": {"command": "make test"},
            },
            *[
                {
                    "type": "tool_event",
                    "call_id": "c1",
                    "name": "terminal",
                    "data": {"stream": "output", "line": line},
                }
                for line in lines
            ],
            {
                "type": "tool_result",
                "call_id": "c1",
                "name": "terminal",
                "ok": True,
                "output": "all passed\nmore",
                "duration_ms": 2340,
            },
            {
                "type": "tool_started",
                "call_id": "c2",
                "name": "read_file",
                "arguments": {"path": "x"},
            },
            {
                "type": "tool_result",
                "call_id": "c2",
                "name": "read_file",
                "ok": False,
                "error": "no such file: x",
                "duration_ms": 10,
            },
        ],
    )
    text = out.getvalue()
    assert '⏺ terminal({"command": "make test"})' in text
    assert f"│ line {TOOL_TAIL_LINES - 1}" in text
    assert f"line {TOOL_TAIL_LINES}" not in text  # the tail is bounded …
    assert "│ … 3 more lines" in text  # … and says what it left out
    assert "⎿ ✔ terminal · 2.3s · all passed more" in text
    assert "⎿ ✗ read_file failed · 0.0s · no such file: x" in text


def test_sub_agent_output_is_indented_and_labelled() -> None:
    r, out = _renderer()
    sub = {"is_subagent": True, "agent_id": "sub-7"}
    for frame in _seq(
        [
            {
                "type": "subagent_started",
                "profile_id": "researcher",
                "task": "find the docs",
                **sub,
            },
            {"type": "text_delta", "text": "found them", **sub},
            {"type": "stream_end", "text": "found them", **sub},
            {"type": "subagent_finished", "completed": True, "tokens": 120, **sub},
            {"type": "text_delta", "text": "Main answer."},
            {"type": "stream_end", "text": "Main answer."},
        ]
    ):
        frame.update({k: v for k, v in frame.items() if k in sub})
        r.frame(frame)
    lines = out.getvalue().splitlines()
    started = next(ln for ln in lines if "sub-agent (researcher)" in ln)
    assert started.startswith("    [sub-7] ↳ sub-agent (researcher): find the docs")
    assert any(ln.startswith("    ") and "found them" in ln for ln in lines)
    assert any(ln.startswith("    [sub-7] ↳ sub-agent done (120 tokens)") for ln in lines)
    assert any(ln.startswith("Main answer.") for ln in lines)
    assert r.busy is False  # only the top-level stream_end ends the run


def test_a_queued_message_shows_its_position() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "message_queued", "text": "and then?", "position": 2, "dropped_total": 1}])
    assert "queued #2 and then? (1 older dropped)" in out.getvalue()


def test_errors_and_warnings_are_one_line_with_what_to_do() -> None:
    r, out = _renderer()
    r.frame({"type": "error", "code": "unauthorized", "message": "bad\ntoken"})
    _feed(
        r,
        [
            {
                "type": "error",
                "code": "llm_connection",
                "message": "cannot connect to http://127.0.0.1:11434",
            },
            {"type": "warning", "code": "anti_stall", "message": "no progress for 3 iterations"},
            {"type": "stream_end", "reason": "error"},
        ],
    )
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    assert lines[0] == (  # a code of the protocol itself is no news: not shown
        "✗ error: bad token — pass --token, set NAVI_TOKEN, or use the daemon's local-token file"
    )
    assert lines[1].startswith("✗ error [llm_connection]: cannot connect to http://127.0.0.1:11434")
    assert "is the LLM server running?" in lines[1]
    assert lines[2] == "⚠ no progress for 3 iterations"
    r.frame({"type": "error", "code": "bad_frame", "message": "every '10': add a unit: 10m"})
    assert out.getvalue().splitlines()[-1] == "✗ error: every '10': add a unit: 10m"


def test_the_answer_is_rendered_as_markdown_block_by_block() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "text_delta", "text": "# Title\n\nSome **bold"}])
    assert "Title" in out.getvalue() and "bold" not in out.getvalue()  # block still open
    _feed(r, [{"type": "text_delta", "text": "** text.\n\n```py\nx = 1\n\ny = 2\n"}])
    assert "Some bold text." in out.getvalue()  # Markdown: no asterisks
    assert "x = 1" not in out.getvalue()  # a blank line inside a fence does not cut it
    _feed(r, [{"type": "text_delta", "text": "```\n"}, {"type": "stream_end", "text": "…"}])
    text = out.getvalue()
    assert "x = 1" in text and "y = 2" in text
    assert "**" not in text and "```" not in text and "…" not in text


def test_split_blocks_cuts_at_the_last_blank_line_outside_a_fence() -> None:
    assert split_blocks("a\n\nb") == ("a\n\n", "b")
    assert split_blocks("a\n\nb\n\nc") == ("a\n\nb\n\n", "c")
    assert split_blocks("```\na\n\nb") == ("", "```\na\n\nb")
    assert split_blocks("no break yet") == ("", "no break yet")


def test_a_replayed_end_without_deltas_shows_the_answer_once() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "stream_end", "text": "the final answer", "prompt_tokens": 900}])
    assert out.getvalue().count("the final answer") == 1
    assert r.status.context_tokens == 900


def test_thinking_is_one_dim_line_until_thinking_is_toggled_on() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "thinking_delta", "text": "one two three"}, {"type": "thinking_end"}])
    assert "✻ thinking… (3 words)" in out.getvalue() and "one two" not in out.getvalue()
    r.show_thinking = True
    _feed(r, [{"type": "thinking_delta", "text": "four five"}, {"type": "text_delta", "text": "x"}])
    assert "✻ four five" in out.getvalue()


def test_a_stopped_run_says_so_and_the_status_line_follows_the_run() -> None:
    r, out = _renderer()
    r.status.session_id, r.status.profile = "s-1", "coder"
    _feed(
        r,
        [
            {"type": "model_info", "model": "qwen3:8b"},
            {"type": "text_delta", "text": "partial"},
        ],
    )
    assert r.busy and r.status.activity == "answering… 1 words"
    _feed(r, [{"type": "stream_end", "stopped": True, "reason": "stopped", "prompt_tokens": 5}])
    text = out.getvalue()
    assert "partial" in text and "■ stopped" in text
    assert "session s-1 · profile coder · model qwen3:8b · context 5 tokens" in text
    assert not r.busy and r.status.activity == ""


def test_task_updates_are_notices_and_replies_are_listed() -> None:
    r, out = _renderer()
    r.frame(
        {
            "type": "task_update",
            "session_id": "s-1",
            "seq": None,
            "task_id": "t-3",
            "tool": "terminal",
            "status": "completed",
            "result_excerpt": "exit 0",
        }
    )
    r.sessions(
        [
            {
                "session_id": "s-9",
                "title": "fix bug",
                "profile": "coder",
                "updated_at": "today",
                "busy": True,
            }
        ]
    )
    r.tasks([{"task_id": "t-3", "tool": "terminal", "status": "running", "age_sec": 4}])
    r.history([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "**hello**"}])
    text = out.getvalue()
    assert "◆ task t-3 terminal: completed — exit 0" in text
    assert "s-9 coder · today fix bug (running)" in text
    assert "t-3 terminal: running · 4s" in text
    assert "› hi" in text and "hello" in text and "**hello**" not in text
    assert "2 messages replayed" in text


def test_the_daemons_numbers_are_shown_readably() -> None:
    r, out = _renderer()
    stamp = time.mktime((2026, 11, 30, 21, 5, 0, 0, 0, -1))
    r.sessions([{"session_id": "s-9", "title": "", "profile": "general", "updated_at": stamp}])
    r.tasks(
        [
            {"task_id": "t-1", "tool": "terminal", "status": "running", "age_sec": 0.029},
            {"task_id": "t-2", "tool": "terminal", "status": "running", "age_sec": 184.5},
        ]
    )
    text = out.getvalue()
    assert "s-9 general · 2026-11-30 21:05" in text
    assert "t-1 terminal: running · 0s" in text
    assert "t-2 terminal: running · 3m 04s" in text


def test_a_reset_drops_a_half_shown_run() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "text_delta", "text": "held until the end"}])
    assert r.busy
    r.reset()
    assert not r.busy and r.status.activity == ""
    _feed(r, [{"type": "text_delta", "text": "fresh"}, {"type": "stream_end", "text": "fresh"}])
    assert "held until the end" not in out.getvalue() and "fresh" in out.getvalue()


def test_an_approval_request_is_a_card_and_its_decision_one_line() -> None:
    r, out = _renderer()
    request = {
        "type": "approval_request",
        "call_id": "c9",
        "tool": "terminal",
        "summary": "terminal run: git push origin main",
        "rule": "profile 'coder' rule 2: terminal run 'git push*' -> ask",
        "mode": "workspace",
        "timeout_sec": 300,
    }
    _feed(r, [request])
    card = out.getvalue().splitlines()
    assert card == [
        "? approve terminal: terminal run: git push origin main",
        "  │ rule: profile 'coder' rule 2: terminal run 'git push*' -> ask",
        "  │ mode workspace · no answer in 300s is a deny",
        "  └ y yes · s this session · a always · n no",
    ]
    _feed(r, [{"type": "approval_decided", "call_id": "c9", "approved": True, "scope": "always"}])
    assert out.getvalue().splitlines()[-1] == "✔ approved terminal (always, by owner)"
    _feed(r, [request, {"type": "approval_decided", "call_id": "c9", "approved": False,
                        "by": "timeout"}])  # fmt: skip
    assert out.getvalue().splitlines()[-1] == "✗ denied terminal (by timeout)"


def test_an_approval_card_of_a_terminal_line_lists_its_parts_and_the_session_grant() -> None:
    r, out = _renderer()
    part = {"text": "git status", "program": "git", "decision": "allow", "paths": []}
    paths = [{"path": "/etc/x", "inside": False}, {"path": "./y", "inside": True}]
    curl = {"text": "curl -o /etc/x y", "program": "curl", "decision": "ask", "paths": paths}
    request = {
        "type": "approval_request", "call_id": "c1", "tool": "terminal", "mode": "full",
        "summary": "terminal run: git status && curl -o /etc/x y", "rule": "part 2: mode full",
        "parts": [part, curl], "grant": "`curl` with any arguments on any path, unsandboxed",
    }  # fmt: skip
    _feed(r, [request])
    assert out.getvalue().splitlines()[2:5] == [
        "  │   ✓ allow: git status",
        "  │   ? ask: curl -o /etc/x y (outside the workspace: /etc/x)",
        "  │ s (this session) allows: `curl` with any arguments on any path, unsandboxed",
    ]


def test_the_approvals_list_and_a_revoke_are_one_line_each() -> None:
    r, out = _renderer()
    grant = {"id": "g-0123456789ab", "scope": "session", "session_id": "s-1", "mode": "full",
             "grants": "`curl` with any arguments in this workspace, unsandboxed"}  # fmt: skip
    always = grant | {"id": "g-ba9876543210", "scope": "always", "session_id": ""}
    _feed(r, [{"type": "grants", "action": "list", "grants": [grant, always]}])
    assert out.getvalue().splitlines() == [
        "  g-0123456789ab · session s-1 · mode full · `curl` with any arguments in this "
        "workspace, unsandboxed",
        "  g-ba9876543210 · always · mode full · `curl` with any arguments in this workspace, "
        "unsandboxed",
        "2 approval grant(s)",
    ]
    _feed(r, [{"type": "grants", "action": "revoke", "grants": [grant]}])
    assert out.getvalue().splitlines()[-1].startswith("revoked g-0123456789ab · session s-1")
    _feed(r, [{"type": "grants", "action": "list", "grants": []}])
    assert out.getvalue().splitlines()[-1] == "no approvals granted"


def test_the_models_silent_work_shows_in_the_toolbar_not_in_the_answer() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "model_working", "step": "choosing a tool", "tokens": 0}])
    assert r.busy and r.status.activity == "the model is working: choosing a tool"
    assert r.status.toolbar().startswith("the model is working: choosing a tool │ ")
    _feed(r, [{"type": "model_working", "step": "writing the arguments of echo", "tokens": 12}])
    assert r.status.activity == "the model is working: writing the arguments of echo (12 tokens)"
    _feed(r, [{"type": "text_delta", "text": "Hi"}])
    assert r.status.activity == "answering… 1 words"
    assert "working" not in out.getvalue()  # the scrollback keeps only the answer


def test_an_answer_printed_block_by_block_is_not_printed_again_at_its_end() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "text_delta", "text": "Para one.\n\nPara two.\n\n"},
              {"type": "stream_end", "text": "Para one.\n\nPara two."}])  # fmt: skip
    assert out.getvalue().count("Para two.") == 1


def test_the_text_before_a_tool_call_comes_before_its_card_and_apart_from_the_next() -> None:
    r, out = _renderer()
    call = {"call_id": "c1", "name": "filesystem", "arguments": {"op": "write"}}
    _feed(r, [{"type": "text_delta", "text": "I'll write the file."},
              {"type": "tool_started", **call},
              {"type": "tool_result", **call, "ok": True, "output": "written", "duration_ms": 5},
              {"type": "text_delta", "text": "Wrote notes.txt."},
              {"type": "stream_end", "text": "Wrote notes.txt."}])  # fmt: skip
    lines = out.getvalue().splitlines()
    first = next(i for i, ln in enumerate(lines) if "I'll write the file." in ln)
    card = next(i for i, ln in enumerate(lines) if "filesystem" in ln)
    then = next(i for i, ln in enumerate(lines) if "Wrote notes.txt." in ln)
    assert first < card < then, lines
    assert out.getvalue().count("I'll write the file.") == 1
    assert out.getvalue().count("Wrote notes.txt.") == 1


def test_a_sub_agents_end_leaves_the_run_going_and_its_text_apart_from_the_answer() -> None:
    r, out = _renderer()
    sub = {"is_subagent": True, "agent_id": "sub-7"}
    _feed(r, [{"type": "text_delta", "text": "Main answer"},
              {"type": "text_delta", "text": "from the sub-agent", **sub},
              {"type": "stream_end", "text": "from the sub-agent", **sub}])  # fmt: skip
    assert r.busy  # the top-level run goes on
    _feed(r, [{"type": "stream_end", "text": "Main answer"}])
    lines = out.getvalue().splitlines()
    assert any(ln.startswith("Main answer") for ln in lines), lines
    assert any(ln.startswith("    ") and "from the sub-agent" in ln for ln in lines), lines
    assert not any("Main answer" in ln and "sub-agent" in ln for ln in lines), lines


def test_a_run_ended_for_the_reason_stopped_says_so() -> None:
    r, out = _renderer()
    _feed(r, [{"type": "text_delta", "text": "partial"},
              {"type": "stream_end", "reason": "stopped"}])  # fmt: skip
    assert "■ stopped" in out.getvalue()


def test_thinking_before_a_tool_call_comes_before_its_card() -> None:
    r, out = _renderer()
    call = {"call_id": "c1", "name": "filesystem", "arguments": {"op": "write"}}
    _feed(r, [{"type": "thinking_delta", "text": "the file first"},
              {"type": "tool_started", **call},
              {"type": "tool_result", **call, "ok": True, "output": "written", "duration_ms": 5},
              {"type": "text_delta", "text": "Done."},
              {"type": "stream_end", "text": "Done."}])  # fmt: skip
    lines = out.getvalue().splitlines()
    thought = next(i for i, ln in enumerate(lines) if "✻ thinking… (3 words)" in ln)
    card = next(i for i, ln in enumerate(lines) if "filesystem" in ln)
    assert thought < card, lines


def test_the_text_before_a_tool_call_is_not_shown_again_by_an_end_that_carries_it() -> None:
    r, out = _renderer()
    call = {"call_id": "c1", "name": "filesystem", "arguments": {"op": "write"}}
    _feed(r, [{"type": "text_delta", "text": "I'll write the file."},
              {"type": "tool_started", **call},
              {"type": "tool_result", **call, "ok": True, "output": "written", "duration_ms": 5},
              {"type": "stream_end", "text": "I'll write the file."}])  # fmt: skip
    assert out.getvalue().count("I'll write the file.") == 1
