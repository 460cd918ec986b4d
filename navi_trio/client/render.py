"""`Renderer`: server frames in, lines on a rich Console out.

It owns only display state and never does I/O other than printing, so tests feed it
frames and read a ``Console(file=StringIO())``. The answer streams block by block, each
finished Markdown block rendered as Markdown; thinking is one dim line (`/thinking`
shows it in full); sub-agent output is indented and labelled; warnings and errors are
one line each, with what to do where we know it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.padding import Padding

from navi_trio.client.cards import TOOL_TAIL_LINES as TOOL_TAIL_LINES
from navi_trio.client.cards import Cards
from navi_trio.client.context_view import context_lines
from navi_trio.client.status import Status as Status
from navi_trio.client.text import ARGS_MAX, RESULT_MAX, one_line
from navi_trio.client.text import split_blocks as split_blocks
from navi_trio.text import terminal_safe
from navi_trio.wire import Frame

WAITING = "waiting for the model…"  # the toolbar, from a message sent to its first frame
# The protocol's own codes say nothing to a person (a refused frame, a refused token):
# the message and the hint do; the others are shown, as a name to look up.
UNTAGGED_CODES = frozenset({"error", "bad_frame", "unauthorized"})
# Codes of refusals that are news, not failures: one dim line with the daemon's words.
NOTICE_CODES = frozenset({"nothing_to_compact"})
# What to do about an error, by its stable code (protocol.md and the agent's codes).
HINTS = {
    "unauthorized": "pass --token, set NAVI_TOKEN, or use the daemon's local-token file",
    "forbidden": "that session or task belongs to another user",
    "not_found": "check the id with /sessions or /tasks",
    "busy": "a run is active: stop it with Ctrl+C or wait, then try again",
    "session_busy": "a run is active: stop it with Ctrl+C or wait, then try again",
    "rate_limited": "slow down a little and try again",
    "limit": "close another chat or delete old sessions (/sessions)",
    "llm_connection": "is the LLM server running? check OLLAMA_HOST / --llm-url (navi doctor)",
    "llm_timeout": "the model did not answer in time: check it is loaded (navi doctor)",
    "llm_status": "the LLM server refused the request: check the model name (navi doctor)",
    "unsupported": "this daemon does not support that yet",
}


@attrs.define
class _Stream:
    """Text and thinking being streamed by one agent (the main one or a sub-agent)."""

    text: str = ""
    thinking: str = ""
    printed: bool = False  # some of this answer already went out
    words: int = 0  # streamed so far (for the toolbar)


class Renderer:
    def __init__(self, console: Console, *, show_thinking: bool = False) -> None:
        self.console = console
        self.show_thinking = show_thinking
        self.status = Status()
        self.busy = False  # a top-level run of our session is streaming
        self.errors = 0  # top-level error lines shown (a piped chat exits 1 when any)
        # While set, the status line at a run's end waits for `release_status` (the app
        # is asking the daemon for the session's profile).
        self.hold_status = False
        self._status_held = False
        self._streams: dict[str | None, _Stream] = {}
        self.cards = Cards(self)  # tool calls, approval requests, the plan

    def reset(self) -> None:
        """Forget a run half-shown (its text not yet printed, its open tool cards): after a
        resync it may be gone (a restarted daemon) and the history shows what was kept."""
        self._streams.clear()
        self.cards.reset()
        self.busy = False
        self.status.activity = ""
        self.hold_status = self._status_held = False

    def put(self, markup: str, who: str = "", style: str | None = None) -> None:
        """One line of rich markup (indented and labelled for a sub-agent, `who`)."""
        markup = terminal_safe(markup)
        if who:
            self.console.print(Padding(f"[dim]{escape(who)}[/] {markup}", (0, 0, 0, 4)))
        else:
            self.console.print(markup, style=style, highlight=False)

    def notice(self, text: str, who: str = "") -> None:
        """A dim one-line notice (status changes, commands' answers)."""
        self.put(f"[dim]{escape(one_line(text))}[/]", who)

    def warning(self, text: str, who: str = "") -> None:
        self.put(f"[yellow]⚠ {escape(one_line(text))}[/]", who)

    def error(self, text: str, code: str | None = None, who: str = "") -> None:
        if code in NOTICE_CODES:
            self.notice(text, who)
            return
        if not who:
            self.errors += 1
        hint = HINTS.get(code or "")
        tail = f" — {hint}" if hint else ""
        tag = f" [{code}]" if code and code not in UNTAGGED_CODES else ""
        self.put(f"[bold red]✗ error{escape(tag)}:[/] {escape(one_line(text))}{tail}", who)

    def markdown(self, text: str, who: str = "") -> None:
        text = terminal_safe(text)
        if not text.strip():
            return
        if who:
            self.console.print(Padding(f"[dim]{escape(who)}[/]", (0, 0, 0, 4)))
            self.console.print(Padding(Markdown(text), (0, 0, 0, 4)))
        else:
            self.console.print(Markdown(text))

    def user(self, text: str) -> None:
        self.console.print(f"[bold cyan]›[/] {escape(terminal_safe(text))}", highlight=False)

    def frame(self, frame: Frame) -> None:
        """Show one server frame (session frames and replies alike)."""
        kind = str(frame.get("type"))
        handler = getattr(self, "_on_" + kind, None) or getattr(self.cards, "on_" + kind, None)
        if handler is None:
            return  # a frame type from a newer server: nothing to show
        handler(frame, self._who(frame))

    @staticmethod
    def _who(frame: Frame) -> str:
        if not frame.get("is_subagent"):
            return ""
        return f"[{frame.get('agent_id') or 'sub-agent'}]"

    def _stream(self, frame: Frame) -> _Stream:
        key = frame.get("agent_id") if frame.get("is_subagent") else None
        return self._streams.setdefault(key, _Stream())

    def mark_busy(self, frame: Frame) -> None:
        """A top-level frame of a run of ours: the run is going."""
        if not frame.get("is_subagent") and frame.get("seq") is not None:
            self.busy = True

    def _on_text_delta(self, frame: Frame, who: str) -> None:
        self.mark_busy(frame)
        stream = self._stream(frame)
        self._end_thinking(stream, who)
        stream.text += str(frame.get("text", ""))
        if not who:
            stream.words += len(str(frame.get("text", "")).split())
            self.status.activity = f"answering… {stream.words} words"
        done, stream.text = split_blocks(stream.text)
        if done:
            self.markdown(done, who)
            stream.printed = True

    def _on_tool_started(self, frame: Frame, who: str) -> None:
        """The text the model wrote before this call comes first, as a paragraph of its
        own: the next round's text starts a new one (the page closes its answer too)."""
        stream = self._stream(frame)
        self._end_thinking(stream, who)
        text, stream.text = stream.text, ""
        if text.strip():
            self.markdown(text, who)
            stream.printed = True
        self.cards.on_tool_started(frame, who)

    def _on_thinking_delta(self, frame: Frame, who: str) -> None:
        self.mark_busy(frame)
        stream = self._stream(frame)
        stream.thinking += str(frame.get("text", ""))
        if not who:
            self.status.activity = f"thinking… {len(stream.thinking.split())} words"

    def _on_thinking_end(self, frame: Frame, who: str) -> None:
        self._end_thinking(self._stream(frame), who)

    def _end_thinking(self, stream: _Stream, who: str) -> None:
        text, stream.thinking = stream.thinking, ""
        if not text.strip():
            return
        if self.show_thinking:
            self.put(f"[dim italic]✻ {escape(text.strip())}[/]", who)
        else:
            words = len(text.split())
            self.put(f"[dim]✻ thinking… ({words} words) — /thinking shows it[/]", who)

    def _flush_text(self, stream: _Stream, who: str, final: str = "") -> None:
        self._end_thinking(stream, who)
        text, stream.text = stream.text, ""
        if not stream.printed and not text and final:
            text = final  # nothing was streamed (e.g. replayed end): show the answer once
        self.markdown(text, who)
        stream.printed = False

    def _on_stream_end(self, frame: Frame, who: str) -> None:
        key = frame.get("agent_id") if frame.get("is_subagent") else None
        stream = self._streams.pop(key, _Stream())
        self._flush_text(stream, who, str(frame.get("text") or ""))
        reason = frame.get("reason", "complete")
        if frame.get("stopped") or reason == "stopped":
            self.put("[yellow]■ stopped[/]", who)
        elif reason not in ("complete", "error"):
            self.warning(f"the run ended: {reason}", who)
        if who:
            return
        self.busy = False
        self.status.activity = ""
        tokens = frame.get("prompt_tokens")
        if isinstance(tokens, int) and tokens > 0:
            self.status.context_tokens = tokens
        if self.hold_status:
            self._status_held = True
        else:
            self.notice(self.status.line())

    def release_status(self) -> None:
        """Print the status line a run's end held back (if any), and hold no more."""
        self.hold_status = False
        if self._status_held:
            self._status_held = False
            self.notice(self.status.line())

    def _on_model_working(self, frame: Frame, who: str) -> None:
        """The model works on a step that streams nothing (the local model choosing a
        tool): the toolbar says so, so a slow model is not taken for a stuck one."""
        self.mark_busy(frame)
        if who:
            return
        tokens = frame.get("tokens")
        count = f" ({tokens} tokens)" if isinstance(tokens, int) and tokens > 0 else ""
        self.status.activity = f"the model is working: {one_line(str(frame.get('step')))}{count}"

    def _on_model_info(self, frame: Frame, who: str) -> None:
        if not who:
            self.status.model = str(frame.get("model"))

    def _on_plan_phase(self, frame: Frame, who: str) -> None:
        self.mark_busy(frame)
        if frame.get("status") == "started":
            self.notice(f"· planning: {frame.get('phase')}…", who)

    def _on_compression_started(self, frame: Frame, who: str) -> None:
        self.notice(f"compressing the context ({frame.get('reason')})…", who)

    def _on_context_compressed(self, frame: Frame, who: str) -> None:
        after = frame.get("tokens_after")
        self.notice(f"context compressed: {frame.get('tokens_before')} → {after} tokens", who)
        if not who and isinstance(after, int):
            self.status.context_tokens = after

    def _on_error(self, frame: Frame, who: str) -> None:
        self.error(str(frame.get("message", "")), frame.get("code"), who)

    def _on_warning(self, frame: Frame, who: str) -> None:
        self.warning(str(frame.get("message", "")), who)

    def _on_message_queued(self, frame: Frame, who: str) -> None:
        text = one_line(str(frame.get("text", "")), ARGS_MAX)
        dropped = frame.get("dropped_total") or 0
        tail = f" ({dropped} older dropped)" if dropped else ""
        self.put(f"[cyan]queued #{frame.get('position')}[/] [dim]{escape(text)}{tail}[/]")

    def _on_budget(self, frame: Frame, who: str) -> None:
        if who:
            return  # a sub-agent's: its parent's line says what the run has left
        self.status.budget = _nearest(frame.get("budgets"))

    def _on_budget_exhausted(self, frame: Frame, who: str) -> None:
        self.put(f"[bold red]✗ budget spent:[/] {escape(one_line(str(frame.get('message'))))}", who)

    def _on_woken(self, frame: Frame, who: str) -> None:
        self.notice("background results arrived: the agent goes on with them")

    def _on_steered(self, frame: Frame, who: str) -> None:
        text = one_line(str(frame.get("text", "")), ARGS_MAX)
        self.put(f"[cyan]↪ steered:[/] {escape(text)}", who)

    def _on_task_update(self, frame: Frame, who: str) -> None:
        status = str(frame.get("status"))
        colour = {"completed": "green", "failed": "red", "cancelled": "yellow"}.get(status, "blue")
        detail = frame.get("error") or frame.get("result_excerpt") or frame.get("args_summary")
        tail = f" — {escape(one_line(str(detail), RESULT_MAX))}" if detail else ""
        self.put(
            f"[{colour}]◆ task {escape(str(frame.get('task_id')))}[/] "
            f"{escape(str(frame.get('tool')))}: {escape(status)}{tail}"
        )

    def _on_subagent_started(self, frame: Frame, who: str) -> None:
        task = one_line(str(frame.get("task", "")), RESULT_MAX)
        self.put(f"[blue]↳ sub-agent ({escape(str(frame.get('profile_id')))}):[/] {task}", who)

    def _on_subagent_finished(self, frame: Frame, who: str) -> None:
        key = frame.get("agent_id")
        if key in self._streams:
            self._flush_text(self._streams.pop(key), who)
        verdict = "[green]done[/]" if frame.get("completed") else "[red]did not finish[/]"
        tokens = frame.get("tokens", 0)
        self.put(f"[blue]↳ sub-agent[/] {verdict} [dim]({tokens} tokens)[/]", who)

    def _on_context(self, frame: Frame, who: str) -> None:
        """A reply to /context."""
        for line in context_lines(frame):
            self.put(escape(line))

    def _on_schedules(self, frame: Frame, who: str) -> None:
        """A reply to /schedule or /schedules."""
        action = frame.get("action")
        if action == "list":
            rows = list(frame.get("schedules") or [])
            for row in rows:
                self.put(f"  {_schedule(row)}")
            self.notice(f"{len(rows)} schedule(s)" if rows else "no schedules")
        elif action == "remove":
            self.notice(f"schedule {frame.get('schedule_id')} removed")
        elif isinstance(frame.get("schedule"), dict):
            self.notice(f"schedule {action}: {_schedule(frame['schedule'])}")

    def _on_schedule_run(self, frame: Frame, who: str) -> None:
        text = one_line(str(frame.get("text") or ""), RESULT_MAX)
        if frame.get("reason") == "skipped":
            sid = escape(str(frame.get("schedule_id")))
            self.put(f"[magenta]⏰ schedule {sid}[/] [yellow]skipped[/]: {escape(text)}")
            return
        self.put(
            f"[magenta]⏰ schedule {escape(str(frame.get('schedule_id')))}[/] ran in "
            f"{escape(str(frame.get('session_id')))} ({escape(str(frame.get('reason')))})"
            + (f": {escape(text)}" if text else "")
        )

    def _on_resync(self, frame: Frame, who: str) -> None:
        self.notice("missed part of the stream: reloading the history")

    def _on_lagged(self, frame: Frame, who: str) -> None:
        self.notice(f"fell behind (seq {frame.get('missed_from')}–{frame.get('missed_to')})")

    def sessions(self, sessions: list[dict[str, Any]]) -> None:
        if not sessions:
            self.notice("no sessions yet")
            return
        for s in sessions:
            busy = " [yellow](running)[/]" if s.get("busy") else ""
            title = escape(one_line(str(s.get("title") or ""), ARGS_MAX))
            sid, profile = escape(str(s.get("session_id"))), escape(str(s.get("profile")))
            when = escape(_when(s.get("updated_at")))
            self.put(f"  [bold]{sid}[/] [dim]{profile} · {when}[/] {title}{busy}")
        self.notice("/resume ID continues one")

    def tasks(self, tasks: list[dict[str, Any]]) -> None:
        if not tasks:
            self.notice("no background tasks")
            return
        for t in tasks:
            self.put(
                f"  [bold]{escape(str(t.get('task_id')))}[/] {escape(str(t.get('tool')))}: "
                f"{escape(str(t.get('status')))} [dim]· {_age(t.get('age_sec'))}[/]"
            )

    def history(self, messages: list[dict[str, Any]], replayed_from: int = 0) -> None:
        """Replay a session's display history (``sessions history``); after a resync only
        its turns from the `replayed_from`-th user message on are passed in."""
        for m in messages:
            role = m.get("role")
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            if role == "user" and m.get("steered"):
                self.put(f"[cyan]↪ steered:[/] {escape(text)}")
            elif role == "user":
                self.user(text)
            elif role == "assistant":
                for call in m.get("tool_calls") or []:
                    fn = call.get("function", call) if isinstance(call, dict) else {}
                    self.put(f"[bold magenta]⏺ {escape(str(fn.get('name', '?')))}[/]")
                self.markdown(text)
            elif role == "tool":
                self.put(f"  ⎿ [dim]{escape(one_line(text, RESULT_MAX))}[/]")
        if replayed_from and not messages:
            self.notice("— history reloaded: every turn was already shown —")
        elif replayed_from:
            self.notice(f"— {len(messages)} messages replayed (turns {replayed_from + 1}+) —")
        else:
            self.notice(f"— {len(messages)} messages replayed —")


def _schedule(row: dict[str, Any]) -> str:
    due = row.get("next_due")
    state = "paused" if row.get("paused") else f"next {_when(due)}" if due else "done"
    where = row.get("session_id") or "new sessions"
    text = one_line(str(row.get("message", "")), ARGS_MAX)
    skipped = f" · last run skipped: {row['last_skip']}" if row.get("last_skip") else ""
    return escape(
        f"{row.get('schedule_id')} {row.get('kind')} {row.get('spec')} · {state} · "
        f"{row.get('runs', 0)} runs · {where}: {text}{skipped}"
    )


_SCOPE_SHOWN = {"user_day": "day", "subagent": "sub-agent"}
_KIND_SHOWN = {"wall_sec": "s", "tool_calls": "tool calls"}


def _nearest(lines: Any) -> str | None:
    """The budget nearest its limit, as "turn tokens 1200/5000" (None: none given)."""
    best: tuple[float, str] | None = None
    for line in lines if isinstance(lines, list) else []:
        if not isinstance(line, dict):
            continue
        spent, limit = line.get("spent"), line.get("limit")
        if not isinstance(spent, int | float) or not isinstance(limit, int | float):
            continue
        share = spent / limit if limit else 1.0
        scope, kind = str(line.get("scope")), str(line.get("kind"))
        scope = _SCOPE_SHOWN.get(scope, scope)
        kind = _KIND_SHOWN.get(kind, kind)
        shown = f"{scope} {kind} {spent:g}/{limit:g}"
        if best is None or share > best[0]:
            best = (share, shown)
    return None if best is None else best[1]


def _age(seconds: Any) -> str:
    """A task's age (seconds, the daemon sends a float) as 4s, 3m 04s or 2h 05m."""
    if not isinstance(seconds, int | float):
        return "?"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _when(stamp: Any) -> str:
    """A sessions list time (seconds since the epoch) as local YYYY-MM-DD HH:MM."""
    if isinstance(stamp, int | float):
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))
    return str(stamp or "")
