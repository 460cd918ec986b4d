"""Completion notes: recorded per job, drained into one system message per turn.

In-memory KV (tests/kvfake_tasks.py); the restart test on a real SQLite file is in
tests/test_task_supervisor.py.
"""

from __future__ import annotations

import trio
from kvfake_tasks import MemoryKV

from navi_trio.core.jobs import NOTES_SCOPE, JobNote, record_note
from navi_trio.core.jobs.task_notes import FOOTER, HEADER, drain_notes, pending_notes
from navi_trio.settings import Settings

SETTINGS = Settings()


async def _record(
    kv: MemoryKV, session: str, task_id: str, summary: str = "ok", **kw: object
) -> None:
    await record_note(
        kv,
        SETTINGS,
        session,
        JobNote(
            task_id=task_id,
            tool=str(kw.pop("tool", "terminal")),
            status=str(kw.pop("status", "completed")),
            summary=summary,
            tokens=int(kw.pop("tokens", 0)),  # type: ignore[call-overload]
        ),
    )


async def test_drain_returns_one_message_in_the_spec_format_and_removes_the_notes() -> None:
    kv = MemoryKV()
    await _record(kv, "s1", "bt-00000001", "PASS 42/42")
    await _record(kv, "s1", "bt-00000002", "exit code 2: make: *** [all] Error 2", status="failed")
    text = await drain_notes(kv, SETTINGS, "s1")
    assert text == "\n".join(
        [
            HEADER,
            "- bt-00000001 (terminal) completed: PASS 42/42",
            "- bt-00000002 (terminal) failed: exit code 2: make: *** [all] Error 2",
            FOOTER,
        ]
    )
    assert text.startswith("[Background task results]\n")
    assert text.endswith(
        "(Use these results to continue your work. Do not start new background\n"
        "tasks in response to this note unless the user asked.)"
    )
    assert kv.keys(NOTES_SCOPE) == []
    assert await drain_notes(kv, SETTINGS, "s1") is None


async def test_drain_with_nothing_pending_returns_none() -> None:
    assert await drain_notes(MemoryKV(), SETTINGS, "s1") is None


async def test_at_most_per_turn_notes_are_listed_and_the_overflow_points_to_tasks_check() -> None:
    kv = MemoryKV()
    ids = [f"bt-0000000{i}" for i in range(7)]
    for task_id in ids:
        await _record(kv, "s1", task_id, f"result of {task_id}")
    text = await drain_notes(kv, SETTINGS, "s1")
    assert text is not None
    listed = [line for line in text.splitlines() if line.startswith("- bt-")]
    assert [line.split()[1] for line in listed] == ids[:5]  # oldest first
    overflow = [line for line in text.splitlines() if "more background task" in line]
    assert len(overflow) == 1
    assert "2 more" in overflow[0]
    assert ids[5] in overflow[0] and ids[6] in overflow[0]
    assert "`tasks check`" in overflow[0]
    assert await pending_notes(kv, "s1") == []  # overflow notes are drained too


async def test_pending_notes_are_capped_and_the_oldest_are_dropped() -> None:
    kv = MemoryKV()
    for i in range(25):
        await _record(kv, "s1", f"bt-{i:08x}")
    notes = await pending_notes(kv, "s1")
    assert len(notes) == SETTINGS.task_notes_max_pending == 20
    assert [n["task_id"] for n in notes] == [f"bt-{i:08x}" for i in range(5, 25)]


async def test_concurrent_finishes_lose_no_note() -> None:
    kv = MemoryKV()
    async with trio.open_nursery() as nursery:
        for i in range(15):
            nursery.start_soon(_record, kv, "s1", f"bt-{i:08x}")
    assert sorted(n["task_id"] for n in await pending_notes(kv, "s1")) == [
        f"bt-{i:08x}" for i in range(15)
    ]


async def test_concurrent_finishes_past_the_cap_converge_to_the_cap() -> None:
    kv = MemoryKV()
    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(_record, kv, "s1", f"bt-{i:08x}")
    assert len(await pending_notes(kv, "s1")) == 20


async def test_notes_are_per_session() -> None:
    kv = MemoryKV()
    await _record(kv, "s1", "bt-aaaaaaaa")
    await _record(kv, "s1:x", "bt-bbbbbbbb")  # a session id that extends the other's
    await _record(kv, "s2", "bt-cccccccc")
    text = await drain_notes(kv, SETTINGS, "s1")
    assert text is not None and "bt-aaaaaaaa" in text
    assert "bt-bbbbbbbb" not in text and "bt-cccccccc" not in text
    assert [n["task_id"] for n in await pending_notes(kv, "s1:x")] == ["bt-bbbbbbbb"]
    assert [n["task_id"] for n in await pending_notes(kv, "s2")] == ["bt-cccccccc"]


async def test_long_summaries_are_one_line_capped_keeping_head_and_tail() -> None:
    kv = MemoryKV()
    body = "START\n" + "x" * 5000 + "\nline two\nPASS 42/42"
    await _record(kv, "s1", "bt-00000001", body)
    text = await drain_notes(kv, SETTINGS, "s1")
    assert text is not None
    line = text.splitlines()[1]
    assert line.startswith("- bt-00000001 (terminal) completed: START x")
    assert line.endswith("line two PASS 42/42")
    assert " … " in line
    summary = line.split(": ", 1)[1]
    assert 250 <= len(summary) <= 300


async def test_sub_agent_notes_show_their_token_count() -> None:
    kv = MemoryKV()
    await _record(kv, "s1", "bt-00000001", "found it", tool="spawn_agent", tokens=5120)
    await _record(kv, "s1", "bt-00000002", "done")
    text = await drain_notes(kv, SETTINGS, "s1")
    assert text is not None
    assert "- bt-00000001 (spawn_agent) completed [sub-agent tokens: 5120]: found it" in text
    assert "- bt-00000002 (terminal) completed: done" in text


async def test_settings_change_the_caps() -> None:
    kv = MemoryKV()
    settings = Settings(task_notes_per_turn=2, task_notes_max_pending=3)
    for i in range(4):
        await record_note(
            kv,
            settings,
            "s1",
            JobNote(task_id=f"bt-{i:08x}", tool="code_exec", status="completed", summary="ok"),
        )
    text = await drain_notes(kv, settings, "s1")
    assert text is not None
    listed = [line.split()[1] for line in text.splitlines() if line.startswith("- bt-")]
    assert listed == ["bt-00000001", "bt-00000002"]  # bt-0 dropped (max 3), 2 listed
    assert "1 more background task(s) finished (bt-00000003)" in text
