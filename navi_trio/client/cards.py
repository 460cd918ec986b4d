"""The chat's cards: tool calls, approval requests and the plan's checklist.

- a tool call is a card: ``⏺ name(args)``, a bounded tail of its live output, then
  ``⎿ ✔ ok · 1.2s`` with the first line of the result;
- an approval request says what, which rule and how long, a terminal line's parts and
  what "this session" grants, and the keys to answer;
- the plan is a checklist that ticks as ``todo_updated`` steps finish.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import attrs
from rich.markup import escape

from navi_trio.approval_text import grant_line, part_lines
from navi_trio.client.text import ARGS_MAX, RESULT_MAX, one_line
from navi_trio.wire import Frame

if TYPE_CHECKING:
    from navi_trio.client.render import Renderer


TOOL_TAIL_LINES = 5  # live output lines shown per tool call before "… N more lines"
# The planner's "— TOOL: name" / "— SELF" tail of a todo step: the plan shows it without.
_STEP_MARK = re.compile(r"\s+—\s+(TOOL:\s*[\w.-]+|SELF)\s*$")
_TICKS = {"done": "✔", "in_progress": "▸", "failed": "✗", "pending": "☐"}


@attrs.define
class _Card:
    name: str
    who: str
    lines: int = 0


class Cards:
    def __init__(self, board: Renderer) -> None:
        self.r = board
        self._cards: dict[str, _Card] = {}
        self._plan: list[dict[str, Any]] = []
        self._asked: dict[str, str] = {}  # call id -> tool of the approval requests shown

    def reset(self) -> None:
        """Forget the open tool cards (a run half-shown)."""
        self._cards.clear()

    def on_plan(self, frame: Frame, who: str) -> None:
        self.r.mark_busy(frame)
        steps = frame.get("steps") or []
        self._plan = [
            {"index": s.get("index", i + 1), "text": s.get("description", ""), "status": "pending"}
            for i, s in enumerate(steps)
            if isinstance(s, dict)
        ]
        if self._plan:
            self._checklist("Plan", who)
        else:
            self.r.markdown(str(frame.get("text", "")), who)

    def on_todo_updated(self, frame: Frame, who: str) -> None:
        steps = [s for s in frame.get("steps") or [] if isinstance(s, dict)]
        if not steps:
            return
        fresh = all(s.get("status", "pending") == "pending" for s in [*steps, *self._plan])
        if fresh and len(steps) == len(self._plan):
            self._plan = steps  # the plan just shown, filled into the todo list: no reprint
            return
        self._plan = steps
        self._checklist("Plan", who)

    def _checklist(self, title: str, who: str) -> None:
        done = sum(1 for s in self._plan if s.get("status") == "done")
        lines = [f"[bold]{title}[/] [dim]{done}/{len(self._plan)}[/]"]
        for step in self._plan:
            status = str(step.get("status", "pending"))
            tick = _TICKS.get(status, "☐")
            text = escape(one_line(_STEP_MARK.sub("", str(step.get("text", "")))))
            if status == "done":
                text = f"[dim strike]{text}[/]"
            elif status == "in_progress":
                text = f"[bold]{text}[/]"
            lines.append(f"  {tick} {step.get('index', '')}. {text}")
        self.r.put("\n".join(lines), who)

    def on_tool_started(self, frame: Frame, who: str) -> None:
        self.r.mark_busy(frame)
        name = str(frame.get("name", "?"))
        self._cards[str(frame.get("call_id"))] = _Card(name, who)
        self.r.status.activity = f"running {name}…"
        args = frame.get("arguments") or {}
        shown = one_line(json.dumps(args, ensure_ascii=False), ARGS_MAX) if args else ""
        self.r.put(f"[bold magenta]⏺ {escape(name)}[/]([dim]{escape(shown)}[/])", who)

    def on_tool_event(self, frame: Frame, who: str) -> None:
        card = self._cards.get(str(frame.get("call_id")))
        if card is None:
            return
        card.lines += 1
        if card.lines > TOOL_TAIL_LINES:
            return  # the count is reported with the result
        data = frame.get("data") or {}
        text = data.get("line") or data.get("text") or data.get("message") or json.dumps(data)
        self.r.put(f"[dim]  │ {escape(one_line(str(text), RESULT_MAX))}[/]", who)

    def on_tool_result(self, frame: Frame, who: str) -> None:
        card = self._cards.pop(str(frame.get("call_id")), None)
        name = str(frame.get("name") or (card.name if card else "?"))
        seconds = int(frame.get("duration_ms") or 0) / 1000
        more = card.lines - TOOL_TAIL_LINES if card else 0
        if more > 0:
            self.r.put(f"[dim]  │ … {more} more lines[/]", who)
        if frame.get("stopped"):
            # Stopped before it finished (Ctrl+C): how long it had run, not "failed".
            self.r.put(f"  ⎿ [yellow]■ {escape(name)} stopped[/] [dim]· {seconds:.1f}s[/]", who)
        elif frame.get("ok"):
            head = one_line(str(frame.get("output", "")), RESULT_MAX)
            self.r.put(
                f"  ⎿ [green]✔ {escape(name)}[/] [dim]· {seconds:.1f}s · {escape(head)}[/]", who
            )
        else:
            reason = one_line(str(frame.get("error") or frame.get("output") or ""), RESULT_MAX)
            self.r.put(
                f"  ⎿ [red]✗ {escape(name)} failed[/] [dim]· {seconds:.1f}s ·[/] {escape(reason)}",
                who,
            )

    def on_approval_request(self, frame: Frame, who: str) -> None:
        """The card of a call waiting for the owner: what, which rule, how long; the keys."""
        tool = str(frame.get("tool") or "?")
        self._asked[str(frame.get("call_id"))] = tool
        summary = one_line(str(frame.get("summary") or ""), RESULT_MAX)
        rule = one_line(str(frame.get("rule") or "?"), RESULT_MAX)
        timeout = frame.get("timeout_sec")
        wait = f"no answer in {timeout}s is a deny" if timeout else "waits for your answer"
        grant = grant_line(frame, "s (this session)")
        self.r.put(
            "\n".join(
                [
                    f"[bold yellow]? approve {escape(tool)}:[/] {escape(summary)}",
                    f"[yellow]  │[/] [dim]rule:[/] {escape(rule)}",
                    *(f"[yellow]  │[/]   {escape(line)}" for line in part_lines(frame)),
                    *([f"[yellow]  │[/] [dim]{escape(grant)}[/]"] if grant else []),
                    f"[yellow]  │[/] [dim]mode {escape(str(frame.get('mode') or '?'))} · "
                    f"{escape(wait)}[/]",
                    "[yellow]  └[/] [bold]y[/] yes · [bold]s[/] this session · "
                    "[bold]a[/] always · [bold]n[/] no",
                ]
            ),
            who,
        )

    def on_grants(self, frame: Frame, who: str) -> None:
        """A reply to /approvals: the grants, or the one revoked."""
        rows = [g for g in frame.get("grants") or [] if isinstance(g, dict)]
        revoked = frame.get("action") == "revoke"
        for g in rows:
            where = f"session {g.get('session_id')}" if g.get("scope") == "session" else "always"
            line = f"{g.get('id')} · {where} · mode {g.get('mode')} · {g.get('grants')}"
            head = "[green]revoked[/] " if revoked else "  "
            self.r.put(head + escape(one_line(line, RESULT_MAX)), who)
        if not revoked:
            self.r.notice(f"{len(rows)} approval grant(s)" if rows else "no approvals granted")

    def on_approval_decided(self, frame: Frame, who: str) -> None:
        call_id = str(frame.get("call_id"))
        tool = self._asked.pop(call_id, "the call")
        by = str(frame.get("by") or "owner")
        scope = str(frame.get("scope") or "once")
        tail = f"{scope}, by {by}" if frame.get("approved") else f"by {by}"
        if frame.get("approved"):
            self.r.put(f"[green]✔ approved {escape(tool)}[/] [dim]({escape(tail)})[/]", who)
        else:
            self.r.put(f"[red]✗ denied {escape(tool)}[/] [dim]({escape(tail)})[/]", who)
