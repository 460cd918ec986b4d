"""Over the wire: a run knows its user (runvars), background tasks are listed, checked
and cancelled by their owner only; and the connection's half of `lagged` (the session
actor's half is core's): a subscription ended with ``lagged`` set becomes a ``lagged``
frame and a resubscription from the last delivered seq.

Rules: as tests/test_api_server.py.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import trio
import trio.testing
from api_ws import open_daemon
from bg_tools import BACKGROUNDABLE, call, calls, make_kit, profile

from navi_trio.api.connection import Connection
from navi_trio.cli.serve import wait_background_jobs
from navi_trio.settings import Settings

TIMEOUT = 30


async def test_runs_know_their_user_and_tasks_belong_to_the_owner(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(call("snapshot", label="who"), call("block", label="j", background=True)),
        {"text": "started"},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=kit.tools(), backgroundable_tools=BACKGROUNDABLE,
            profiles={"bg": profile(["block", "snapshot", "tasks"])},
        ) as d:  # fmt: skip
            async with d.connect("alice") as alice:
                made = await alice.request({"type": "message", "content": "hi", "profile": "bg"})
                sid = made["session_id"]
                await alice.until_end(sid)
                (seen,) = kit.snapshot.by_label("who")
                assert seen["vars"]["user_id"] == d.ids["alice"]
                assert seen["vars"]["user_role"] == "user"
                assert seen["vars"]["user_info"]["name"] == "alice"
                listed = await alice.request({"type": "tasks", "action": "list"})
                (task,) = listed["tasks"]
                assert (task["tool"], task["status"], task["session_id"]) == (
                    "block",
                    "running",
                    sid,
                )
                tid = task["task_id"]
                async with d.connect("bob") as bob:
                    assert (await bob.request({"type": "tasks", "action": "list"}))["tasks"] == []
                    for action in ("check", "cancel"):
                        err = await bob.request({"type": "tasks", "action": action, "task_id": tid})
                        assert err["code"] == "not_found", err
                    err = await bob.request(
                        {"type": "tasks", "action": "cancel", "task_id": tid, "session_id": sid}
                    )
                    assert err["code"] == "forbidden"
                assert kit.block.cancelled == []
                checked = await alice.request({"type": "tasks", "action": "check", "task_id": tid})
                assert checked["task"]["status"] == "running"
                done = await alice.request({"type": "tasks", "action": "cancel", "task_id": tid})
                assert done["cancelled"] is True
                await kit.block.wait_finished()
                assert kit.block.cancelled == ["j"]
            async with d.connect("root") as root:  # an admin sees every user's tasks
                listed = await root.request({"type": "tasks", "action": "list"})
                assert [(t["task_id"], t["status"]) for t in listed["tasks"]] == [
                    (tid, "cancelled")
                ]


class _Sub:
    def __init__(self, size: int) -> None:
        self.send, self.frames = trio.open_memory_channel[dict[str, Any]](size)
        self.lagged: tuple[int, int] | None = None
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.frames.close()


class _Actor:
    session_id = "s1"
    epoch = "e1"

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, str | None]] = []
        self.subs: list[_Sub] = []

    def subscribe(self, last_seq: int | None, epoch: str | None = None) -> _Sub:
        self.calls.append((last_seq, epoch))
        self.subs.append(_Sub(10))
        return self.subs[-1]


async def test_a_lagged_subscription_is_reported_and_resumed_from_the_last_seq() -> None:
    server = types.SimpleNamespace(
        runtime=types.SimpleNamespace(settings=Settings.from_env({})), metrics=None
    )
    conn = Connection(server, ws=None, peer="test")  # type: ignore[arg-type]
    actor = _Actor()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            conn._nursery = nursery
            conn.subscribe(actor, None, None)  # type: ignore[arg-type]
            first = actor.subs[0]
            for seq in (1, 2):
                first.send.send_nowait({"type": "text_delta", "seq": seq})
            first.lagged = (3, 9)
            first.send.close()  # what the actor does to a subscriber that fell behind
            got = [json.loads(await conn._outbox.get()) for _ in range(3)]
            assert [f.get("seq") for f in got[:2]] == [1, 2]
            assert got[2] == {"type": "lagged", "session_id": "s1", "missed_from": 3,
                              "missed_to": 9}  # fmt: skip
            await trio.testing.wait_all_tasks_blocked()
            assert actor.calls == [(None, None), (2, "e1")]
            second = actor.subs[1]
            second.send.send_nowait({"type": "resync", "seq": 9})
            second.send.send_nowait({"type": "text_delta", "seq": 10})
            assert [json.loads(await conn._outbox.get())["seq"] for _ in range(2)] == [9, 10]
            # Ended without lagged (the actor retired): the pump stops, nothing resubscribes.
            second.send.close()
            await trio.testing.wait_all_tasks_blocked()
            assert len(actor.calls) == 2 and not conn.subscribed("s1")


async def test_shutdown_waits_for_background_jobs_only_as_long_as_the_setting(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        calls(call("block", label="a", background=True), call("block", label="b",
              background=True)),
        {"text": "started"},
    ]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=kit.tools(), backgroundable_tools=BACKGROUNDABLE,
            profiles={"bg": profile(["block"])},
        ) as d:  # fmt: skip
            rt = d.harness.runtime
            async with d.connect("alice") as c:
                made = await c.request({"type": "message", "content": "hi", "profile": "bg"})
                await c.until_end(made["session_id"])
            await kit.block.wait_started(2)
            jobs = rt.supervisor.list_jobs(made["session_id"])
            # 0 s: nothing is waited for; both jobs still run (the runtime cancels them).
            await wait_background_jobs(rt, 0)
            assert [j.status for j in jobs] == ["running", "running"]
            # A job that finishes within the wait is waited for (event-driven, no polling).
            returned = trio.Event()

            async def waiter() -> None:
                await wait_background_jobs(rt, 3600.0)
                returned.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                kit.block.release("a")
                await jobs[0].done.wait()
                await trio.testing.wait_all_tasks_blocked()
                assert not returned.is_set()  # b still runs
                kit.block.release("b")
                await returned.wait()
            assert [j.status for j in jobs] == ["completed", "completed"]
