"""navi's session frames as ACP ``session/update`` payloads, and a run's stop reason.

Text and thinking become message and thought chunks (a sub-agent's text stays inside
its own tool call); plans and todos become ``plan``; tool calls, sub-agents and
background jobs become tool calls, a filesystem write or edit with a diff. Diffs come
from the call's arguments: the daemon may be on another machine, so files are never
read here. Every text handed on is cut at `TEXT_MAX` characters.
"""

from __future__ import annotations

import posixpath
from typing import Any

TEXT_MAX = 64 * 1024
TITLE_MAX = 200

# ACP's tool kinds: read, edit, delete, move, search, execute, think, fetch, other.
_FS_KIND = {
    "read": "read",
    "list": "search",
    "write": "edit",
    "append": "edit",
    "edit": "edit",
    "mkdir": "edit",
    "delete": "delete",
}
_TOOL_KIND = {
    "terminal": "execute",
    "code_exec": "execute",
    "ssh_exec": "execute",
    "spawn_agent": "think",
    "todo": "think",
    "scratchpad": "think",
    "memory": "read",
    "peer": "fetch",
    "tasks": "other",
    "switch_profile": "other",
}
_TODO_STATUS = {
    "pending": "pending",
    "in_progress": "in_progress",
    "done": "completed",
    "failed": "completed",
}


def cut(text: str, limit: int = TEXT_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_kind(name: str, args: dict[str, Any]) -> str:
    if name == "filesystem":
        return _FS_KIND.get(str(args.get("action")), "other")
    if name.startswith("mcp__") and "fetch" in name:
        return "fetch"
    return _TOOL_KIND.get(name, "other")


def tool_title(name: str, args: dict[str, Any]) -> str:
    if name == "filesystem":
        title = f"{args.get('action', '?')} {args.get('path', '')}".strip()
    elif name in ("terminal", "ssh_exec") and isinstance(args.get("command"), str):
        title = f"$ {args['command']}"
    elif name == "spawn_agent":
        title = f"sub-agent: {args.get('task') or args.get('profile') or ''}"
    else:
        title = name
    return cut(" ".join(title.split()), TITLE_MAX)


def _path(cwd: str, raw: Any) -> str | None:
    if not isinstance(raw, str) or not raw or raw.startswith("manual:"):
        return None
    return posixpath.normpath(raw if posixpath.isabs(raw) else posixpath.join(cwd, raw))


def locations(cwd: str, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    path = _path(cwd, args.get("path")) if name == "filesystem" else None
    if name in ("terminal", "code_exec") and isinstance(args.get("cwd"), str):
        path = _path(cwd, args["cwd"])
    return [] if path is None else [{"path": path}]


def diff(cwd: str, name: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """The diff a successful filesystem call made, from its arguments."""
    if name != "filesystem":
        return None
    path, action = _path(cwd, args.get("path")), args.get("action")
    if path is None:
        return None
    if action == "write" and isinstance(args.get("content"), str):
        return {"type": "diff", "path": path, "oldText": None, "newText": cut(args["content"])}
    if action == "edit" and isinstance(args.get("old"), str) and isinstance(args.get("new"), str):
        return {
            "type": "diff",
            "path": path,
            "oldText": cut(args["old"]),
            "newText": cut(args["new"]),
        }
    return None


def text_content(text: str) -> dict[str, Any]:
    return {"type": "content", "content": {"type": "text", "text": cut(text)}}


def stop_reason(end: dict[str, Any]) -> str:
    """ACP's stopReason for a top-level ``stream_end``."""
    reason = end.get("reason")
    if end.get("stopped") or reason == "stopped":
        return "cancelled"
    if reason in ("max_iterations", "budget_exhausted"):
        return "max_turn_requests"
    if end.get("done_reason") == "length":
        return "max_tokens"
    return "end_turn"


def usage(end: dict[str, Any]) -> dict[str, int] | None:
    prompt, completion = end.get("prompt_tokens"), end.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    prompt, completion = max(prompt, 0), max(completion, 0)
    return {"inputTokens": prompt, "outputTokens": completion, "totalTokens": prompt + completion}


class Updates:
    """What the editor sees of one session's frames (see the module docstring)."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.calls: dict[str, tuple[str, dict[str, Any]]] = {}  # call id -> (tool, args)
        self._tasks: set[str] = set()
        self._agents: set[str] = set()
        self._live: dict[str, str] = {}  # call id -> its live output so far (a tail)

    def tool_call(self, call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls[call_id] = (name, args)
        title, kind = tool_title(name, args), tool_kind(name, args)
        where = locations(self.cwd, name, args)
        return _start(call_id, title, kind, "pending", rawInput=args, locations=where)

    def profile_switched(self, frame: dict[str, Any]) -> str | None:
        """The profile a top-level ``switch_profile`` call that succeeded moved the
        session to (from the call's arguments; before `of` forgets the call), or None."""
        if frame.get("type") != "tool_result" or frame.get("is_subagent") or not frame.get("ok"):
            return None
        name, args = self.calls.get(str(frame.get("call_id")), ("", {}))
        wanted = args.get("profile_id")
        return wanted if name == "switch_profile" and isinstance(wanted, str) else None

    def of(self, frame: dict[str, Any]) -> list[dict[str, Any]]:
        kind = frame.get("type")
        sub = bool(frame.get("is_subagent"))
        if kind == "text_delta" and not sub:
            return [_chunk("agent_message_chunk", str(frame.get("text", "")))]
        if kind == "thinking_delta" and not sub:
            return [_chunk("agent_thought_chunk", str(frame.get("text", "")))]
        if kind == "plan":
            steps = frame.get("steps") or []
            entries = [str(s.get("description", "")) for s in steps if isinstance(s, dict)]
            if not entries and frame.get("text"):
                entries = [str(frame["text"])]
            return [_plan([(e, "pending") for e in entries])]
        if kind == "todo_updated":
            steps = [s for s in frame.get("steps") or [] if isinstance(s, dict)]
            return [
                _plan(
                    [
                        (str(s.get("text", "")), _TODO_STATUS.get(str(s.get("status")), "pending"))
                        for s in steps
                    ]
                )
            ]
        if kind == "tool_started":
            args = frame.get("arguments")
            args = args if isinstance(args, dict) else {}
            start = self.tool_call(str(frame.get("call_id")), str(frame.get("name")), args)
            return [start, _update(start["toolCallId"], status="in_progress")]
        if kind == "tool_event":
            data = frame.get("data")
            text = data.get("text") if isinstance(data, dict) else None
            if not isinstance(text, str) or not text:
                return []
            # Each event brings the lines since the last one; the editor's card shows the
            # content it was sent last, so it gets the output so far (its tail).
            call_id = str(frame.get("call_id"))
            so_far = self._live.get(call_id)
            so_far = text if so_far is None else f"{so_far}\n{text}"
            self._live[call_id] = so_far = so_far[-TEXT_MAX:]
            return [_update(call_id, content=[text_content(so_far)])]
        if kind == "tool_result":
            return [self._result(frame)]
        if kind == "subagent_started":
            aid = f"agent-{frame.get('agent_id')}"
            self._agents.add(aid)
            title = cut(f"sub-agent {frame.get('profile_id')}: {frame.get('task', '')}", TITLE_MAX)
            return [_start(aid, title, "think", "in_progress")]
        if kind == "subagent_finished":
            aid = f"agent-{frame.get('agent_id')}"
            if aid not in self._agents:
                return []
            status = "completed" if frame.get("completed") else "failed"
            return [_update(aid, status=status, content=[text_content(str(frame.get("text", "")))])]
        if kind == "task_update":
            return self._task(frame)
        return []

    def _result(self, frame: dict[str, Any]) -> dict[str, Any]:
        call_id = str(frame.get("call_id"))
        self._live.pop(call_id, None)
        name, args = self.calls.pop(call_id, (str(frame.get("name")), {}))
        ok = bool(frame.get("ok"))
        text = str(frame.get("output") or "") if ok else str(frame.get("error") or "")
        content = [text_content(text)] if text else []
        change = diff(self.cwd, name, args) if ok else None
        if change is not None:
            content.append(change)
        return _update(
            call_id,
            status="completed" if ok else "failed",
            content=content,
            rawOutput={"ok": ok, "output": cut(text)},
        )

    def _task(self, frame: dict[str, Any]) -> list[dict[str, Any]]:
        tid = f"task-{frame.get('task_id')}"
        status = {"running": "in_progress", "completed": "completed"}.get(
            str(frame.get("status")), "failed"
        )
        excerpt = str(frame.get("result_excerpt") or frame.get("error") or "")
        content = [text_content(excerpt)] if excerpt else []
        if tid in self._tasks:
            return [_update(tid, status=status, content=content)]
        self._tasks.add(tid)
        title = cut(f"background {frame.get('tool')}: {frame.get('args_summary', '')}", TITLE_MAX)
        return [_start(tid, title, "execute", status, content=content)]


def _chunk(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def _plan(entries: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "sessionUpdate": "plan",
        "entries": [
            {"content": cut(c, TITLE_MAX * 5), "priority": "medium", "status": s}
            for c, s in entries
        ],
    }


def _start(call_id: str, title: str, kind: str, status: str, **fields: Any) -> dict[str, Any]:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": call_id,
        "title": title,
        "kind": kind,
        "status": status,
        **fields,
    }


def _update(call_id: str, **fields: Any) -> dict[str, Any]:
    return {"sessionUpdate": "tool_call_update", "toolCallId": call_id, **fields}


def history(cwd: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session's display history as the updates that replay it (``session/load``)."""
    out: list[dict[str, Any]] = []
    updates = Updates(cwd)
    for m in messages:
        role, content = m.get("role"), m.get("content")
        text = content if isinstance(content, str) else ""
        if role == "user":
            out.append(_chunk("user_message_chunk", cut(text)))
        elif role == "assistant":
            if text:
                out.append(_chunk("agent_message_chunk", cut(text)))
            for call in m.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                fn = call.get("function", call)
                fn = fn if isinstance(fn, dict) else {}
                args = fn.get("arguments")
                args = args if isinstance(args, dict) else {}
                cid = str(call.get("id") or f"h{len(out)}")
                out.append(
                    {
                        **updates.tool_call(cid, str(fn.get("name", "?")), args),
                        "status": "completed",
                    }
                )
        elif role == "tool":
            answered = m.get("tool_call_id")
            if isinstance(answered, str) and answered in updates.calls:
                out.append(_update(answered, status="completed", content=[text_content(text)]))
    return out
