"""Reliability: nothing leaks over a soak (issue 11, "No leaks").

In-process runtime (the harness) with the real terminal tool and the fake LLM over real
HTTP. A soak of ``NAVI_SOAK_ROUNDS`` (default 35) rounds, each: a normal turn, a turn
stopped while the model stalls, and a background ``sleep 60`` that the test cancels —
about 100 runs, stops and cancellations over three sessions. Afterwards open file
descriptors, child processes (zombies included) and live trio tasks are back at their
counts after the warm-up round, and no orphaned ``sleep`` is left anywhere.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import assert_paired, of_type, with_tools
from reliability import descendants, open_fds, trio_task_count

from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness, SessionDriver

pytestmark = pytest.mark.slow  # its tests start processes

ROUNDS = int(os.environ.get("NAVI_SOAK_ROUNDS", "35"))
SESSIONS = ("soak-a", "soak-b", "soak-c")
SLEEP = "60.4242"  # an unusual argument: an orphaned sleep is found by it (not our child)


def _sleepers() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", SLEEP.encode()]:
            found.append(int(entry))
    return found


def _bg_call() -> dict[str, Any]:
    # bash forks the sleep (a command follows it): a job that loses its grandchild leaks it.
    args = {"action": "run", "command": f"sleep {SLEEP}; true", "background": True}
    return {"tool_calls": [{"name": "terminal", "arguments": args}]}


async def _one_round(h: Harness, drivers: dict[str, SessionDriver], i: int) -> None:
    assert h.fake is not None
    s = drivers[SESSIONS[i % len(SESSIONS)]]
    # A normal turn.
    h.add_replies({"text": f"answer {i}"})
    s.send(f"plain {i}")
    frames = await s.until_end()
    assert frames[-1]["reason"] == "complete", frames[-1]
    # A turn stopped while the model has not said a word.
    seen = len(h.fake.chat_requests)
    h.add_replies({"text": "never", "delay_first": 3600})
    s.send(f"stop me {i}")
    while len(h.fake.chat_requests) == seen:
        await h.fake.wait_requests(len(h.fake.requests) + 1)
    assert s.stop()
    frames = await s.until_end()
    assert frames[-1]["stopped"] is True, frames[-1]
    # A background job, cancelled by the test.
    h.add_replies(_bg_call(), {"text": f"started {i}"})
    s.send(f"background {i}")
    frames = await s.until_end()
    (result,) = of_type(frames, "tool_result")
    assert result["ok"], (result.get("error"), result.get("output"))
    jobs = [j for j in h.runtime.supervisor.list_jobs(s.session_id) if j.status == "running"]
    assert len(jobs) == 1, jobs
    assert h.runtime.supervisor.cancel(s.session_id, jobs[0].task_id)
    await jobs[0].done.wait()
    await s.idle()


async def test_a_soak_of_runs_stops_and_cancelled_jobs_leaks_nothing(tmp_path: Path) -> None:
    with trio.fail_after(60 + 2 * ROUNDS):
        tools = with_tools(["terminal", "tasks"], planning_first_message=False)
        async with open_harness(
            tmp_path, tasks_rate_limit=10_000, profiles={"general": tools}
        ) as h:
            drivers = {sid: await h.session(sid) for sid in SESSIONS}
            for i in range(len(SESSIONS)):  # warm-up: every session, every kind once
                await _one_round(h, drivers, i)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()  # what earlier tests left to the collector closes now, not mid-soak
            start = (open_fds(), descendants(), _sleepers(), trio_task_count())
            for i in range(ROUNDS):
                await _one_round(h, drivers, len(SESSIONS) + i)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            end = (open_fds(), descendants(), _sleepers(), trio_task_count())
            print(
                f"leak suite: {ROUNDS} rounds; fds, children, orphaned sleeps, tasks: "
                f"{start} -> {end}"
            )
            assert end == start
            for sid in SESSIONS:
                assert_paired(await h.runtime.store.load_context(sid))
