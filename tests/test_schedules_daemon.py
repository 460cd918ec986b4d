"""Scheduled runs through real `navi serve` processes and `navi schedule` (issue 23).

A schedule due while its daemon was down (killed with SIGKILL) runs once when the next
daemon starts, and never again after another restart; `navi schedule` adds, lists,
pauses and removes through the daemon, one line each. Real daemon processes, loopback
only, port 0, absolute deadlines. The daemon that crashes is a new interpreter; the ones
started after it, and the `navi schedule` commands, are forked from the warm fork server
(tests/navi_forks.py): their subject is what the daemon and the command do, not how
Python starts them. No wait on the wall clock: the due time that passes while no daemon
runs is written into the stopped daemon's database (the schedule's row is all a daemon
knows of it), and the model holds its answer behind a gate until the restarted daemon's
client is there to hear the notice.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from reliability import navi_serve
from test_api_daemon import client, serve
from test_cli import fake_llm, forked, messages

from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow
DEADLINE = 90


async def test_a_due_time_missed_while_the_daemon_was_down_runs_once_after_the_restart(
    env: dict[str, str], tmp_path: Path
) -> None:
    data = Path(env["NAVI_DATA_DIR"])
    with trio.fail_after(DEADLINE):
        async with open_fake_llm([{"text": "good morning to you"}], loop=True) as llm:
            async with serve(env, llm.url) as proc:
                async with client(proc.url, data) as c:
                    added = await c.request(
                        {"type": "schedule", "action": "add", "every": "1h", "new": True,
                         "message": "good morning"}
                    )  # fmt: skip
                    assert added["type"] == "schedules", added
                    sid = added["schedule"]["schedule_id"]
                proc.send_signal(signal.SIGKILL)  # a crash, before the due time
                await proc.wait()
            # While no daemon runs, its due time passes: the row says when it was due.
            missed = time.time() - 60
            async with SQLiteStore.open(tmp_path / "navi.db") as store:
                await store.set_schedule(sid, paused=False, next_due=missed)
            # The model holds its answer until the restarted daemon's client is there
            # to hear the notice.
            llm.gate = trio.Event()
            log = tmp_path / "daemon.log"
            async with (
                navi_serve(env, llm.url, log, forked=True) as proc,
                client(proc.url, data) as c,
            ):
                llm.gate.set()
                done = await c.until_type("schedule_run", schedule_id=sid)
                assert (done["reason"], done["text"]) == ("complete", "good morning to you")
                listed = await forked("schedule", "list", "--json", "--url", proc.url, env=env,
                                      cwd=tmp_path)  # fmt: skip
            # And again: nothing runs twice.
            async with navi_serve(env, llm.url, log, forked=True) as proc:
                again = await forked("schedule", "list", "--json", "--url", proc.url, env=env,
                                     cwd=tmp_path)  # fmt: skip
            assert len(llm.chat_requests) == 1
    (row,) = json.loads(listed.out)["schedules"]
    assert (row["runs"], row["last_session_id"]) == (1, done["session_id"])
    assert row["next_due"] > missed + 3600  # the next one after now, not after the missed one
    assert json.loads(again.out)["schedules"] == [row]
    saved = await messages(tmp_path / "navi.db", done["session_id"])
    assert [(m["role"], m["content"]) for m in saved] == [
        ("user", "good morning"), ("assistant", "good morning to you")
    ]  # fmt: skip


async def test_navi_schedule_adds_lists_pauses_and_removes_in_one_line_each(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with (
            fake_llm(tmp_path, [{"text": "x"}]) as llm,
            navi_serve(env, llm, tmp_path / "daemon.log", forked=True) as proc,
        ):
            url = ("--url", proc.url)

            async def run(*args: str) -> Any:
                return await forked("schedule", *args, *url, env=env, cwd=tmp_path)

            added = await run("add", "--new", "--every", "2h", "--no-catch-up",
                              "--budget", '{"turn": {"tokens": 20000}}', "tidy up")  # fmt: skip
            sid = added.out.split("\t")[0]
            listed = await run("list")
            paused = await run("pause", sid)
            removed = await run("remove", sid)
            bad = await run("add", "--new", "--every", "5s", "too often")
            no_when = await run("add", "--new", "what")
            empty = await run("list")
    assert added.code == 0, added
    assert sid.startswith("sch-") and "every 2h" in added.out and "tidy up" in added.out
    assert listed.out.strip().splitlines() == [added.out.strip()]
    assert paused.code == 0 and "\tpaused\t" in paused.out
    assert removed.out.strip() == f"schedule {sid} removed"
    assert bad.code == 1 and "at least 1 minute" in bad.err and len(bad.err_lines) == 1
    assert no_when.code == 1 and "one of the arguments --cron --every --at" in no_when.err
    assert empty.code == 0 and empty.out == "no schedules\n"
