"""Reliability: a real `navi serve` killed with SIGKILL at many points (issue 11).

Each daemon is forked from the tests' warm process (`navi_serve(forked=True)`,
tests/navi_forks.py): a process of its own, SIGKILLed and restarted on the same
database, that listens in a few tenths of a second instead of a new interpreter's second
or two.

The fake LLM (in this process, real HTTP on 127.0.0.1) plays multi-tool conversations
with small delays, cycling: a todo call, two parallel calls, a final answer. Each round
starts the daemon on the same DB, sends a few messages to a few sessions, and kills the
daemon with SIGKILL after a number of frames. After each kill, every user
message the daemon acknowledged (its ``ok`` reply, running or queued) is in the history
or, queued when the daemon died, in the store's queue after it (the restarted daemon
runs those first): in order, once;
every tool call has its result once the session is loaded (as the restarted daemon
loads it); and the sessions go on: the last round is not killed and every session
answers it normally.

The plans and kill points come from fixed seeds (`SEEDS`, one test each), so that a
failure names what to replay: ``NAVI_CRASH_SEED`` runs that one seed alone, and
``NAVI_CRASH_KILLS`` sets the number of kills (default 8). A failure reports the seed,
each life's plan and kill point, where each lost message was (history, queue) after
each kill, the warnings the client saw, and the daemon's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from agent_tools import assert_paired
from api_ws import Client, open_daemon
from reliability import START_LIMIT, clean_env, navi_serve
from trio_websocket import ConnectionClosed

from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow
# The first is the seed of the one loss CI saw ('message 22 of life 5'): with 20 kills
# at the shipped cap of 5 it replays it now and then, a queued message the cap dropped
# (named in a message_dropped warning and the log), which is why QUEUE_MAX is above reach.
SEEDS = (478179314, 20261206, 11)
KILLS = int(os.environ.get("NAVI_CRASH_KILLS", "8"))
# Real seconds for one life: the daemon's start (its own limit) and a few messages. Per
# life, not for the whole: on a loaded machine a whole-test budget of a few seconds a
# life ran out (20 kills in 180 s) with nothing hung; a hang still ends, naming its life.
LIFE_LIMIT = START_LIMIT + 60
# Above any queue the suite can build (at most 3 messages per session per life): the
# cap's drops are the cap's test, not a crash's (`NAVI_MESSAGE_QUEUE_MAX`).
QUEUE_MAX = 3 * (KILLS + 1) + 1
DELAY = {"delay_first": 0.01, "delay_chunk": 0.005}
QUIET_S = 5.0  # no frame this long while waiting for idle: look at the histories
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "todo", "arguments": {"action": "add", "text": "look"}}], **DELAY},
    {
        "tool_calls": [
            {"name": "scratchpad", "arguments": {"action": "append", "content": "note"}},
            {"name": "todo", "arguments": {"action": "list"}},
        ],
        **DELAY,
    },  # fmt: skip
    {"thinking": "that should do", "text": "All done for this message, friend.", **DELAY},
]


class _Round:
    """One daemon life: send messages, record the acks, die after `kill_at` frames."""

    def __init__(self, client: Client, kill_at: int | None) -> None:
        self.c = client
        self.kill_at = kill_at
        self.seen = 0
        self.reached = trio.Event()
        # Per session, its last message: (text, queued, index in c.frames of its ok).
        self.last: dict[str, tuple[str, bool, int]] = {}
        orig = client.next

        async def counting() -> dict[str, Any]:
            frame = await orig()
            self.seen += 1
            if self.kill_at is not None and self.seen >= self.kill_at:
                self.reached.set()
            return frame

        client.next = counting  # type: ignore[method-assign]

    async def send(self, sid: str | None, text: str) -> tuple[str, bool]:
        frame: dict[str, Any] = {"type": "message", "content": text}
        if sid is not None:
            frame["session_id"] = sid
        got = await self.c.request(frame)
        if got["type"] == "session":  # a new session: the ok follows
            got = await self.c.until_type("ok", id=got["id"])
        assert got["type"] == "ok", got
        sid, queued = str(got["session_id"]), bool(got["queued"])
        self.last[sid] = (text, queued, next(i for i, f in enumerate(self.c.frames) if f is got))
        return sid, queued

    async def until_idle(self, sids: set[str]) -> None:
        """Until the run of each session's last message ended.

        A queued message's `message_queued` frame says how many runs are ahead of it
        (`position`: the queue before it and the running one, which may be a run a
        crash left queued): that many stream_ends follow it, then its own."""
        while not all([self._ended(sid) for sid in sids]):
            with trio.move_on_after(QUIET_S) as quiet:
                await self.c.next()  # kept in c.frames
            if quiet.cancelled_caught and await self._answered(sids):
                return  # the daemon is quiet and every last message has its answer

    async def _answered(self, sids: set[str]) -> bool:
        """Each session's history ends with the final answer to its last message (an
        assistant message without tool calls: one with them is the turn going on). (A quiet
        daemon whose stream_ends did not add up to the count `_ended` expects: seen once
        in CI, every run finished and nothing queued; the frames that would say why were
        not kept. The history is what a lost message would show.)"""
        for sid in sids:
            got = await self.c.request({"type": "sessions", "action": "history", "session_id": sid})
            messages = got.get("messages") or []
            text = self.last[sid][0]
            users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
            if not users or messages[users[-1]].get("content") != text:
                return False
            last = messages[-1]
            if last.get("role") != "assistant" or len(messages) == users[-1] + 1:
                return False
            if last.get("tool_calls"):  # mid-turn (a quiet spell on a busy machine)
                return False
        return True

    def _ended(self, sid: str) -> bool:
        text, queued, since = self.last[sid]
        need = 1
        if queued:
            mark = [i for i, f in enumerate(self.c.frames) if f["type"] == "message_queued"
                    and f["session_id"] == sid and f["text"] == text]  # fmt: skip
            if not mark:
                return False  # not here yet: it may come after the ok
            since, need = mark[-1], self.c.frames[mark[-1]]["position"] + 1
        ends = [f for f in self.c.frames[since + 1 :] if f["type"] == "stream_end"
                and not f["is_subagent"] and f["session_id"] == sid]  # fmt: skip
        return len(ends) >= need


def _check_after_kill(
    loaded: dict[str, Any], db: Path, acked: dict[str, list[str]], order: dict[str, list[str]]
) -> list[str]:
    """What is wrong with the store after a kill (each session as the restarted daemon
    loads it: `loaded`), one line per problem."""
    problems = []
    for sid, texts in acked.items():
        session = loaded[sid]
        if session is None:
            problems.append(f"session {sid} lost")
            continue
        # What a crash left queued runs after the restart, after the history.
        users = [m["content"] for m in session.messages if m["role"] == "user"]
        users += _queued_rows(db, sid)
        sent = order[sid]
        if len(users) != len(set(users)):
            problems.append(f"{sid}: a user message twice: {users}")
        elif not set(users) <= set(sent):
            problems.append(f"{sid}: a message nobody sent: {users}")
        elif users != sorted(users, key=sent.index):
            problems.append(f"{sid}: out of order: {users}")
        missing = [t for t in texts if t not in users]
        if missing:
            problems.append(f"{sid}: acknowledged {missing} LOST, history+queue has {users}")
        for what in ("context", "messages"):
            try:
                assert_paired(getattr(session, what))
            except AssertionError as exc:
                problems.append(f"{sid}: {what} not paired: {exc}")
    return problems


async def _load_all(db: Path, sids: list[str]) -> dict[str, Any]:
    async with SQLiteStore.open(db) as store:
        return {sid: await store.load_session(sid) for sid in sids}


@attrs.define
class _Life:
    """One daemon life, for the report of a failure."""

    life: int
    kill_at: int | None
    plan: list[tuple[str | None, int]]
    seen: int = 0  # frames read when the kill came
    # After the kill: per session, each user message's place (history, queued by pid).
    places: dict[str, dict[str, str]] = attrs.field(factory=dict)
    said: list[str] = attrs.field(factory=list)  # the warnings and errors the client saw


def _places(db: Path, sids: list[str]) -> dict[str, dict[str, str]]:
    """Where each user message of each session is in the store now (read-only)."""
    out: dict[str, dict[str, str]] = {}
    with contextlib.closing(sqlite3.connect(db)) as conn:
        for sid in sids:
            here = out[sid] = {}
            rows = conn.execute(
                "SELECT content, position FROM messages WHERE session_id = ? AND role = 'user'"
                " ORDER BY position", [sid],
            )  # fmt: skip
            for text, position in rows:
                here[text] = f"history@{position:g}"
            queued = conn.execute(
                "SELECT data, pid, id FROM queued WHERE session_id = ? ORDER BY id", [sid]
            )
            for data, pid, row_id in queued:
                here[json.loads(data)["text"]] = f"queued#{row_id} pid {pid}"
    return out


def _said(frames: list[dict[str, Any]]) -> list[str]:
    """The client's frames worth a look after a loss: warnings, errors, queue notes."""
    kinds = ("warning", "error", "message_queued", "ok")
    return [json.dumps(f)[:300] for f in frames if f.get("type") in kinds]


def _report(
    seed: int, lives: list[_Life], order: dict[str, list[str]], problems: list[str], log: Path
) -> str:
    """A failure's story: the seed, each life's plan and kill, where the lost messages
    were after each kill, what the client was told, and the daemon's log."""
    lost = [t for sid, texts in order.items() for t in texts if any(t in p for p in problems)]
    lines = [f"NAVI_CRASH_SEED={seed} NAVI_CRASH_KILLS={KILLS}", *problems, ""]
    for life in lives:
        lines.append(f"life {life.life}: plan {life.plan}, kill after {life.kill_at} frames"
                     f" (read {life.seen})")  # fmt: skip
        for text in lost:
            for sid, places in life.places.items():
                sent_in = int(text.rsplit(" ", 1)[1])  # 'message N of life L'
                if text in order.get(sid, ()) and sent_in <= life.life:
                    lines.append(f"  {text!r} in {sid}: {places.get(text, 'absent')}")
        lines += [f"  client: {said}" for said in life.said
                  if any(text in said for text in lost) or '"warning"' in said]  # fmt: skip
    daemon = log.read_text(errors="replace").splitlines() if log.exists() else []
    tail = [line for line in daemon if "httpx" not in line][-200:]  # (not each LLM call)
    return "\n".join([*lines, "", "daemon log (last 200 lines):", *tail])


class _Book:
    """What was sent and acknowledged, over all the daemon's lives."""

    def __init__(self) -> None:
        self.acked: dict[str, list[str]] = {}  # acknowledged (running or queued)
        self.order: dict[str, list[str]] = {}  # every message sent, in order
        self.sids: list[str] = []
        self.n = 0

    async def converse(self, r: _Round, plan: list[tuple[str | None, int]], life: int) -> None:
        used: set[str] = set()
        for target, count in plan:
            sid = target
            for _ in range(count):
                self.n += 1
                text = f"message {self.n} of life {life}"
                if sid is not None:
                    # Sent before it is acknowledged: a kill between the daemon saving it
                    # and its `ok` reaching us leaves it in history, rightly.
                    self.order.setdefault(sid, []).append(text)
                sid, _ = await r.send(sid, text)
                used.add(sid)
                if sid not in self.acked:
                    self.sids.append(sid)
                    self.acked[sid] = []
                if text not in self.order.setdefault(sid, []):
                    self.order[sid].append(text)
                self.acked[sid].append(text)
        await r.until_idle(used)

    async def talk_until_killed(self, r: _Round, plan: list[tuple[str | None, int]],
                                life: int) -> None:  # fmt: skip
        try:
            await self.converse(r, plan, life)
        except ConnectionClosed:
            pass
        r.reached.set()  # all done before the kill point: kill now


CRASH_SEED = os.environ.get("NAVI_CRASH_SEED")


@pytest.mark.parametrize("seed", [int(CRASH_SEED)] if CRASH_SEED else SEEDS)
async def test_sigkill_at_many_points_loses_no_acknowledged_message(
    tmp_path: Path, seed: int
) -> None:
    print(f"crash suite: NAVI_CRASH_SEED={seed} NAVI_CRASH_KILLS={KILLS}")
    rng = random.Random(seed)
    env = clean_env(tmp_path, NAVI_MESSAGE_QUEUE_MAX=str(QUEUE_MAX))
    db = Path(env["NAVI_DB"])
    log = tmp_path / "serve.log"
    book = _Book()
    lives: list[_Life] = []

    async def check(life: _Life) -> str | None:
        """The failure's report, if the store is wrong after this life."""
        loaded = await _load_all(db, book.sids)
        life.places = _places(db, book.sids)
        problems = _check_after_kill(loaded, db, book.acked, book.order)
        if not problems and life.kill_at is None:
            problems = [f"{sid}: left queued" for sid in book.sids if _queued_rows(db, sid)]
        return _report(seed, lives, book.order, problems, log) if problems else None

    async def live(life: _Life, llm_url: str) -> None:
        with log.open("a") as out:
            out.write(f"--- life {life.life}: {life.plan}, kill after {life.kill_at} frames\n")
        async with (
            navi_serve(env, llm_url, log, log_level="info", forked=True) as d,
            d.connect() as c,
        ):
            r = _Round(c, life.kill_at)
            if life.kill_at is None:  # not killed: every session answers normally
                await book.converse(r, life.plan, life.life)
                await _assert_answered(c, book.sids)
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(book.talk_until_killed, r, life.plan, life.life)
                    await r.reached.wait()
                    d.proc.kill()
                    await d.proc.wait()
            life.seen = r.seen
            life.said = _said(c.frames)

    failed = None
    async with open_fake_llm(SCRIPT, loop=True) as llm:
        for n in range(KILLS + 1):
            if n < KILLS:
                kill_at: int | None = rng.randint(1, 80)
                pool: list[str | None] = [*book.sids, None, None]
                targets = rng.sample(pool, k=min(2, len(book.sids) + 1))
                plan = [(sid, rng.randint(1, 3)) for sid in targets]
            else:  # the last life
                kill_at, plan = None, [(sid, 1) for sid in book.sids]
            lives.append(_Life(n, kill_at, plan))
            with trio.move_on_after(LIFE_LIMIT) as late:
                await live(lives[-1], llm.url)
            if late.cancelled_caught:
                hung = [f"life {n} did not end within {LIFE_LIMIT} s"]
                failed = _report(seed, lives, book.order, hung, log)
                break
            with trio.fail_after(LIFE_LIMIT):
                failed = await check(lives[-1])
            if failed:
                break
    if failed:
        pytest.fail(failed, pytrace=False)
    total = sum(len(v) for v in book.acked.values())
    print(f"crash suite: {KILLS} kills, {len(book.sids)} sessions, {total} acknowledged messages")


async def _assert_answered(c: Client, sids: list[str]) -> None:
    """Each session's history ends with the fake's final answer."""
    for sid in sids:
        history = await c.request({"type": "sessions", "action": "history", "session_id": sid})
        said = history["messages"][-1]
        quiet = ("text_delta", "thinking_delta", "tool_event")
        seen = [(f["type"], f.get("code") or f.get("reason") or f.get("name"))
                for f in c.frames
                if f.get("session_id") == sid and f["type"] not in quiet]  # fmt: skip
        assert said["role"] == "assistant" and "All done" in said["content"], (sid, seen)


def _queued_rows(db: Path, sid: str) -> list[str]:
    """The texts queued in the store (read-only: adopting them would make them ours)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT data FROM queued WHERE session_id = ? ORDER BY id", [sid])
        return [json.loads(data)["text"] for (data,) in rows]


async def test_a_queued_acknowledged_message_survives_sigkill(tmp_path: Path) -> None:
    # B and C are acknowledged as queued behind A, the daemon is SIGKILLed, and the
    # restarted daemon runs them, in order, before D sent after the restart.
    env = clean_env(tmp_path)
    db = Path(env["NAVI_DB"])
    with trio.fail_after(60):
        # The first answer never comes: the run holds the session while B, C are queued.
        async with open_fake_llm([{"text": "slow", "delay_first": 3600}]) as llm:
            async with (
                navi_serve(env, llm.url, tmp_path / "serve.log", forked=True) as d,
                d.connect() as c,
            ):
                r = _Round(c, None)
                sid, queued = await r.send(None, "A runs")
                assert not queued
                await llm.wait_requests(1)
                for text in ("B is queued", "C is queued"):
                    _, queued = await r.send(sid, text)
                    assert queued
                d.proc.kill()
                await d.proc.wait()
        async with SQLiteStore.open(db) as store:
            users = [m["content"] for m in await store.load_messages(sid) if m["role"] == "user"]
        assert users == ["A runs"]
        assert _queued_rows(db, sid) == ["B is queued", "C is queued"]
        replies = [{"text": f"answer {n}"} for n in "BCD"]
        async with open_fake_llm(replies) as llm:
            async with (
                navi_serve(env, llm.url, tmp_path / "serve.log", forked=True) as d,
                d.connect() as c,
            ):
                await c.request({"type": "subscribe", "session_id": sid, "last_seq": 0})
                await _Round(c, None).send(sid, "D after the restart")
                for _ in range(3):
                    await c.until_end(sid)
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
        said = [(m["role"], m["content"]) for m in history["messages"]]
        assert said == [
            ("user", "A runs"),
            ("user", "B is queued"), ("assistant", "answer B"),
            ("user", "C is queued"), ("assistant", "answer C"),
            ("user", "D after the restart"), ("assistant", "answer D"),
        ]  # fmt: skip
        assert _queued_rows(db, sid) == []


async def test_messages_a_kill_left_queued_count_toward_the_cap_after_the_restart(
    tmp_path: Path,
) -> None:
    # What the kill suite once saw as a loss ('message 22 of life 5', at the shipped cap
    # of 5): rows a killed daemon left queued are the session's queue after the restart,
    # so messages sent then can push the oldest acknowledged one out. That is the cap's
    # documented drop, named to the subscribers and in the daemon's log, not a crash's
    # loss: the kill suite keeps its queues below the cap for that reason.
    env = clean_env(tmp_path)  # the shipped cap
    db = Path(env["NAVI_DB"])
    log = tmp_path / "serve.log"
    held = [{"text": "slow", "delay_first": 3600}]  # a run that holds the session
    texts = [f"queued {n}" for n in range(1, 6)]
    with trio.fail_after(90):
        async with open_fake_llm(held) as llm:
            async with navi_serve(env, llm.url, log, forked=True) as d, d.connect() as c:
                r = _Round(c, None)
                sid, _ = await r.send(None, "runs first")
                await llm.wait_requests(1)
                for text in texts:  # the cap's 5, acknowledged
                    assert (await r.send(sid, text))[1]
                d.proc.kill()
                await d.proc.wait()
        assert _queued_rows(db, sid) == texts
        async with open_fake_llm(held) as llm:
            async with navi_serve(env, llm.url, log, forked=True) as d, d.connect() as c:
                await c.request({"type": "subscribe", "session_id": sid, "last_seq": 0})
                await llm.wait_requests(1)  # 'queued 1' runs: saved, off the queue
                for text in ("after 1", "after 2"):  # 4 + 1 waiting, then one more
                    assert (await _Round(c, None).send(sid, text))[1]
                warning = await c.until_type("warning", session_id=sid)
                d.proc.kill()
                await d.proc.wait()
    assert warning["code"] == "message_dropped" and "'queued 2'" in warning["message"]
    assert "'queued 2'" in log.read_text() and "was dropped" in log.read_text()
    async with SQLiteStore.open(db) as store:
        users = [m["content"] for m in await store.load_messages(sid) if m["role"] == "user"]
    assert users + _queued_rows(db, sid) == [
        "runs first", "queued 1", "queued 3", "queued 4", "queued 5", "after 1", "after 2"
    ]  # fmt: skip


async def test_the_ok_of_a_running_message_comes_after_it_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the kill suite: the ok went out as the run started, before the run saved
    # the user message; a SIGKILL in between lost an acknowledged message. Here the run
    # is held just before its save (reading the task notes) until every task is blocked:
    # an ok sent before the save would be read by then.
    import navi_trio.core.turn.agent as agent_module

    entered, gate = trio.Event(), trio.Event()

    async def held_notes(*_args: Any) -> None:
        entered.set()
        await gate.wait()

    monkeypatch.setattr(agent_module, "collect_notes", held_notes)
    with trio.fail_after(30):
        async with open_daemon(tmp_path, replies=[{"text": "hi"}]) as d, d.connect("alice") as c:
            store = d.harness.runtime.store
            async with trio.open_nursery() as nursery:

                async def open_gate() -> None:
                    await entered.wait()
                    await trio.testing.wait_all_tasks_blocked(cushion=0.01)
                    gate.set()

                nursery.start_soon(open_gate)
                created = await c.request({"type": "message", "content": "keep me"})
                ok = await c.until_type("ok", id=created["id"])
                saved = await store.load_messages(str(ok["session_id"]))
                assert [m["content"] for m in saved][:1] == ["keep me"]
