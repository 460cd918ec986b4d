"""A user's share of the machine: `terminal open` processes end with their session, with
their user and when nobody uses them; one user cannot take every background-task slot.

Rules: real processes (``sleep``), a real runtime on a real SQLite file where the test
is about the daemon's wiring; the idle limit and the caps on trio's autojump clock.
Every test has an absolute time limit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from bg_tools import BACKGROUNDABLE, call, calls, make_kit, of_type
from bg_tools import profile as bg_profile
from realtime import real_time_limit
from test_task_supervisor import running_supervisor, until

from navi_trio.errors import TaskRejectedError
from navi_trio.settings import Settings
from navi_trio.store.fence import pid_alive
from navi_trio.testing import open_harness
from navi_trio.tools.procs import ProcessPool

TIMEOUT = 30
pytestmark = pytest.mark.slow  # real processes (sleep)


async def test_a_process_nobody_uses_is_ended_after_the_idle_limit(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The kill's own waits (SIGTERM's grace, then a bounded wait for the reap) pass at
    once on the autojump clock, so `wait_exit` may return while the SIGKILLed process
    is still dying: its end is awaited on its pidfd (a real event, no clock), which it
    only reaches killed (a `sleep 1000`), bounded by the real-time limit."""
    pool = ProcessPool(idle_sec=60)
    with real_time_limit(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            start = trio.current_time()
            handle = await pool.open("s1", "sleep 1000", tmp_path)
            pidfd = os.pidfd_open(pool.list("s1")[0].pid)
            try:
                await trio.sleep(50)
                assert (await pool.read("s1", handle, 100)).running  # a use: 60 s from here
                await trio.sleep(50)
                assert pool.list("s1")[0].running  # 100 s after the start, 50 after the read
                await pool.wait_exit("s1", handle)
                assert 110 <= trio.current_time() - start < 120
                read = await pool.read("s1", handle, 100)
                assert not read.running
                assert read.ended == "nobody used it for 60 s (NAVI_TERMINAL_IDLE_SEC)", read
                # Readable once the process has exited: the proof it ended. (A probe of
                # /proc right after can still see it running: the kernel wakes pidfd
                # waiters before it marks the task a zombie.)
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
            nursery.cancel_scope.cancel()


async def test_deleting_a_session_ends_its_processes_and_removing_a_user_ends_theirs(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path) as h:
            rt = h.runtime
            bob = await rt.store.create_user("bob", "navi_bob-token-0123456789", "user")
            ann = await rt.store.create_user("ann", "navi_ann-token-0123456789", "user")
            for sid, user in (("s-gone", ann), ("s-bob", bob), ("s-ann", ann)):
                await rt.session_service.create(
                    sid, user_id=user["id"], user_name=user["name"], profile_id=None
                )
            pool = rt.processes
            handles = {
                sid: await pool.open(sid, "sleep 1000", tmp_path, user_id=user["id"])
                for sid, user in (("s-gone", ann), ("s-bob", bob), ("s-ann", ann))
            }
            pids = {sid: pool.list(sid)[0].pid for sid in handles}
            assert await rt.session_service.delete("s-gone")
            assert pool.list("s-gone") == [] and not pid_alive(pids["s-gone"])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool.wait_exit, "s-bob", handles["s-bob"])
                await trio.testing.wait_all_tasks_blocked()
                await rt.store.remove_user("bob")  # the users table signals the daemon
            assert pool.list("s-bob") == [] and not pid_alive(pids["s-bob"])
            assert pool.list("s-ann")[0].running and pid_alive(pids["s-ann"])  # not hers


async def test_one_user_cannot_take_every_background_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = trio.Event()
    with real_time_limit(TIMEOUT):
        async with running_supervisor(Settings(tasks_max_per_user=6)) as (sup, _, _kv):
            for session in ("a1", "a2"):
                for _ in range(3):
                    sup.submit(session, "terminal", {}, until(release), user_id="alice")
            with pytest.raises(TaskRejectedError) as refused:
                sup.submit("a3", "terminal", {}, until(release), user_id="alice")
            assert str(refused.value) == (
                "your sessions already run 6 background tasks (tasks_max_per_user)"
            )
            for _ in range(5):  # bob still has the daemon's slots (20 in all)
                sup.submit("b1", "terminal", {}, until(release), user_id="bob")
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            sup.submit("a3", "terminal", {}, until(trio.Event()), user_id="alice")  # freed


async def test_a_background_call_counts_for_the_user_who_started_it(tmp_path: Path) -> None:
    kit = make_kit()
    replies: list[dict[str, Any]] = [
        calls(call("block", label="one", background=True)),
        {"text": "first started"},
        calls(call("block", label="two", background=True)),
        {"text": "second refused"},
    ]
    profiles = {"bg": bg_profile(["block", "tasks"], planning_first_message=False)}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=profiles, tools=kit.tools(),
            backgroundable_tools=BACKGROUNDABLE, tasks_max_per_user=1,
        ) as h:  # fmt: skip
            alice = await h.user("alice")
            await h.turn("s1", "one", profile_id="bg", user_id=alice)
            frames = await h.turn("s2", "two", profile_id="bg", user_id=alice)
            (result,) = of_type(frames, "tool_result", name="block")
            assert result["ok"] is False, result
            assert "tasks_max_per_user" in result["error"], result
            kit.block.release("one")
