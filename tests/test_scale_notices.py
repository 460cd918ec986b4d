"""Two runtimes joined as daemons on one PostgreSQL, in one process: a user's notices (a
scheduled run ended, or was skipped) reach the user's clients on the other daemon too,
after the run's frames there, once each.

Real PostgreSQL (its LISTEN / NOTIFY carries the notices), the fake LLM over real HTTP on
127.0.0.1. No sleeps; the test under `trio.fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from pg_server import pg_url_with_schema as pg_url_with_schema
from test_broadcast_relay import drained
from test_scale_relay import daemon

from navi_trio.api.auth import new_token
from navi_trio.core.turn import UserMessage
from navi_trio.notices import ScheduleRun

pytestmark = pytest.mark.slow  # its PostgreSQL server is a process

TIMEOUT = 60


async def test_a_scheduled_runs_notice_reaches_the_users_follower_on_another_daemon_once(
    tmp_path: Path, pg_url: str
) -> None:
    """A runs a scheduled message of alice's session; alice follows it on B. B's client
    gets the run's frames, then its ``schedule_run``, as A's does; notices that say a run
    was skipped (no session), published on either, come next on both, and none twice."""
    replies: list[dict[str, Any]] = [{"text": "good morning to you"}]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, []) as b:
            assert b.cluster is not None
            alice = (await b.store.create_user("alice", new_token()))["id"]
            await b.store.create_session("s1", profile_id="general", user_id=alice)
            on_b = await b.sessions.get("s1")
            await b.cluster.follow("s1")  # before A starts: A reads it with the follows
            sub_b = on_b.subscribe()
            with b.notices.subscribe(alice) as notes_b:
                async with daemon(tmp_path / "a", pg_url, replies) as a:
                    on_a = await a.sessions.get("s1")
                    sub_a = on_a.subscribe()
                    with a.notices.subscribe(alice) as notes_a:
                        msg = UserMessage(
                            "good morning",
                            user_id=alice,
                            kind="schedule",
                            headless=True,
                            schedule_id="sch-1",
                        )
                        on_a.send_message(msg)
                        await on_a.idle.wait()
                        got_a = [await notes_a.receive()]
                        frames_a = drained(sub_a)
                        got_b = [await notes_b.receive()]
                        frames_b = drained(sub_b)  # what B's client had before the notice
                        # Each side in turn, each waiting for the last: a notice that came
                        # back to its own daemon through the bus would be met first.
                        skipped = ScheduleRun("sch-2", None, "skipped", "too many", 1.0)
                        a.notices.publish(alice, skipped)
                        got_b.append(await notes_b.receive())
                        back = ScheduleRun("sch-3", None, "skipped", "too many", 2.0)
                        b.notices.publish(alice, back)
                        got_a += [await notes_a.receive(), await notes_a.receive()]
                        got_b.append(await notes_b.receive())
                        last = ScheduleRun("sch-4", None, "skipped", "too many", 3.0)
                        a.notices.publish(alice, last)
                        got_a.append(await notes_a.receive())
                        got_b.append(await notes_b.receive())
    assert [f["type"] for f in frames_a][-1] == "stream_end"
    assert [f["type"] for f in frames_b][-1] == "stream_end", [f["type"] for f in frames_b]
    ran = ScheduleRun("sch-1", "s1", "complete", "good morning to you", got_a[0].at)
    assert got_a == got_b == [ran, skipped, back, last]
