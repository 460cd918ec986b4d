"""Completion notes: how a finished background job reaches the agent's next turn.

A job's note is kept in the kv table (scope ``task_notes``); the session's next turn
drains every pending one into ONE system message (in the context, not in the UI)::

    [Background task results]
    - bt-ab12cd34 (terminal) completed: PASS 42/42
    (Use these results to continue your work. Do not start new background
    tasks in response to this note unless the user asked.)

Each note is its own key, ``{session_id}:{wall time ns, 20 digits}:{task_id}``, so two
jobs ending at once never race a read-modify-write: a writer adds its key, then trims the
oldest beyond ``task_notes_max_pending``, which converges whatever the interleaving.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import attrs
import trio

from navi_trio.settings import Settings
from navi_trio.tools.base import KVStore, cap_text

NOTES_SCOPE = "task_notes"
HEADER = "[Background task results]"
FOOTER = (
    "(Use these results to continue your work. Do not start new background\n"
    "tasks in response to this note unless the user asked.)"
)
# What a note keeps of a job's output; what one line of the drained message shows.
SUMMARY_STORED_MAX = 2000
SUMMARY_SHOWN_MAX = 300
# Overflow lines name at most this many task ids, to keep the message short.
OVERFLOW_IDS_SHOWN = 20
# Deleting drained notes must finish even if the turn is stopped meanwhile.
_DELETE_DEADLINE_SEC = 10.0

log = logging.getLogger(__name__)


@attrs.frozen
class JobNote:
    """What a finished background job tells its session's next turn."""

    task_id: str
    tool: str
    status: str
    summary: str
    tokens: int = 0


async def record_note(kv: KVStore, settings: Settings, session_id: str, note: JobNote) -> None:
    """Store a completion note; keep at most `task_notes_max_pending` (oldest dropped)."""
    key, value = note_entry(session_id, note)
    await kv.kv_set(NOTES_SCOPE, key, value)
    await trim_notes(kv, settings, session_id)


def note_entry(session_id: str, note: JobNote) -> tuple[str, dict[str, Any]]:
    """The kv key and value of a completion note (scope `NOTES_SCOPE`)."""
    key = f"{session_id}:{time.time_ns():020d}:{note.task_id}"
    value = {
        "session_id": session_id,
        "task_id": note.task_id,
        "tool": note.tool,
        "status": note.status,
        "summary": cap_text(note.summary, SUMMARY_STORED_MAX),
        "tokens": int(note.tokens),
        "finished_at": time.time(),
    }
    return key, value


async def trim_notes(kv: KVStore, settings: Settings, session_id: str) -> None:
    """Drop the oldest pending notes beyond `task_notes_max_pending`."""
    pending = await _session_notes(kv, session_id)
    excess = len(pending) - max(settings.task_notes_max_pending, 0)
    for old_key, _ in pending[: max(excess, 0)]:
        log.info("dropping task note %s of session %s (too many pending)", old_key, session_id)
        await kv.kv_delete(NOTES_SCOPE, old_key)


async def pending_notes(kv: KVStore, session_id: str) -> list[dict[str, Any]]:
    """The session's pending notes, oldest first, without removing them."""
    return [value for _, value in await _session_notes(kv, session_id)]


@attrs.frozen
class NoteBatch:
    """The notes of one turn as one system message, and the kv keys they came from."""

    text: str
    keys: tuple[str, ...]


async def collect_notes(kv: KVStore, settings: Settings, session_id: str) -> NoteBatch | None:
    """All pending notes of the session as one system message, without removing them.

    At most `task_notes_per_turn` notes are written out; the others are named by task id
    with a pointer to `tasks check`. None when there is nothing pending. The caller
    removes the notes (`remove_notes`) once the message is saved: a crash in between
    delivers them twice rather than never.
    """
    notes = await _session_notes(kv, session_id)
    if not notes:
        return None
    per_turn = max(settings.task_notes_per_turn, 0)
    shown, rest = notes[:per_turn], notes[per_turn:]
    lines = [HEADER]
    lines.extend(_note_line(value) for _, value in shown)
    if rest:
        ids = [str(value.get("task_id", "?")) for _, value in rest]
        named = ", ".join(ids[:OVERFLOW_IDS_SHOWN])
        if len(ids) > OVERFLOW_IDS_SHOWN:
            named += f", and {len(ids) - OVERFLOW_IDS_SHOWN} more"
        lines.append(
            f"- {len(rest)} more background task(s) finished ({named}): "
            "call `tasks check` with a task_id to see its result."
        )
    lines.append(FOOTER)
    return NoteBatch(text="\n".join(lines), keys=tuple(key for key, _ in notes))


async def remove_notes(kv: KVStore, keys: tuple[str, ...]) -> None:
    # Shielded: once we start removing notes, finish (a cancel before removes nothing).
    with trio.move_on_after(_DELETE_DEADLINE_SEC, shield=True):
        for key in keys:
            await kv.kv_delete(NOTES_SCOPE, key)


async def drain_notes(kv: KVStore, settings: Settings, session_id: str) -> str | None:
    """Remove all pending notes of the session and return them as one system message."""
    batch = await collect_notes(kv, settings, session_id)
    if batch is None:
        return None
    await remove_notes(kv, batch.keys)
    return batch.text


async def _session_notes(kv: KVStore, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await kv.kv_list(NOTES_SCOPE, f"{session_id}:")
    # The prefix alone would also match a session id that extends this one with ":...".
    own = [
        (key, value)
        for key, value in rows
        if isinstance(value, dict) and value.get("session_id") == session_id
    ]
    own.sort(key=lambda row: row[0])
    return own


def _note_line(note: dict[str, Any]) -> str:
    task_id = note.get("task_id", "?")
    tool = note.get("tool", "?")
    status = note.get("status", "?")
    tokens = int(note.get("tokens") or 0)
    extra = f" [sub-agent tokens: {tokens}]" if tokens or tool == "spawn_agent" else ""
    summary = _one_line(str(note.get("summary", "")), SUMMARY_SHOWN_MAX)
    return f"- {task_id} ({tool}) {status}{extra}: {summary or '(no output)'}"


def _one_line(text: str, limit: int) -> str:
    """Whitespace collapsed; head and tail kept, since test output ends with the verdict."""
    flat = re.sub(r"\s+", " ", text).strip()
    if len(flat) <= limit:
        return flat
    head = limit * 2 // 3
    tail = limit - head - 3
    return f"{flat[:head]} … {flat[-tail:]}"
