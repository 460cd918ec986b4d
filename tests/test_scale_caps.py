"""Caps that hold across daemons (issue 20 "Caps hold across daemons"), counted in
PostgreSQL: the task supervisor's global, per-session and sub-agent caps and its
per-session rate limit, and the per-user connection limit.

"Two daemons" are two stores on one fresh database, each with its Cluster and its
TaskSupervisor (the background jobs wait on trio events: no sleeps); the connection
limit is checked on two real `navi serve` processes. Every test under `trio.fail_after`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from daemons import pg_daemons
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from trio_websocket import open_websocket_url

from navi_trio.api.auth import read_local_token
from navi_trio.core.cluster import Cluster
from navi_trio.core.jobs import Job, TaskSupervisor
from navi_trio.core.turn import SessionLeases
from navi_trio.errors import TaskRejectedError
from navi_trio.settings import Settings
from navi_trio.store.postgres import PostgresStore
from navi_trio.testing import open_fake_llm
from navi_trio.tools.base import ToolResult

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 60
SLOT_FREED = """
CREATE OR REPLACE FUNCTION slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('slot_freed', OLD.key); RETURN OLD; END $$;
CREATE OR REPLACE TRIGGER slot_freed AFTER DELETE ON slots
    FOR EACH ROW EXECUTE FUNCTION slot_freed();
"""


@asynccontextmanager
async def daemon(url: str, settings: Settings) -> AsyncIterator[TaskSupervisor]:
    """A store, a cluster identity (its live ``daemons`` row) and a running supervisor."""
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(PostgresStore.open(url))
        leases = SessionLeases(store)
        cluster = Cluster(store.bus(), store, leases, 60.0)
        await cluster.bus.heartbeat(cluster.owner, leases.pid, leases.host, 60.0)
        sup = TaskSupervisor(settings, store, lambda sid, ev: None)
        sup.shared = cluster
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(sup.run)
        yield sup
        nursery.cancel_scope.cancel()


def waiting(release: trio.Event) -> Any:
    async def runner(job: Job) -> ToolResult:
        await release.wait()
        return ToolResult.success("done")

    return runner


async def test_task_caps_and_the_rate_limit_hold_across_two_daemons(pg_url: str) -> None:
    settings = Settings(tasks_max_global=2, tasks_max_per_session=1, tasks_rate_limit=3)
    release = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with daemon(pg_url, settings) as a, daemon(pg_url, settings) as b:
            one = await a.start("s1", "terminal", {}, waiting(release))
            # The same session on the other daemon: its per-session cap is counted here.
            with pytest.raises(TaskRejectedError, match="tasks_max_per_session"):
                await b.start("s1", "terminal", {}, waiting(release))
            two = await b.start("s2", "terminal", {}, waiting(release))
            # Two jobs run in all: a third, on either daemon, passes the global cap.
            for sup in (a, b):
                with pytest.raises(TaskRejectedError, match="daemons already run 2"):
                    await sup.start("s3", "terminal", {}, waiting(release))
            release.set()
            await one.done.wait()
            await two.done.wait()
            # Ended jobs give their slots back, but still count in the rate window.
            release2 = trio.Event()
            three = await b.start("s1", "terminal", {}, waiting(release2))
            release2.set()
            await three.done.wait()
            four = await a.start("s1", "terminal", {}, waiting(release2))
            await four.done.wait()
            with pytest.raises(TaskRejectedError, match="tasks_rate_limit"):
                await b.start("s1", "terminal", {}, waiting(release2))
    assert sql(pg_url, "SELECT count(*) FROM slots WHERE NOT released") == [(0,)]


async def test_a_dead_daemons_slots_stop_counting(pg_url: str) -> None:
    settings = Settings(tasks_max_global=1)
    release = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with daemon(pg_url, settings) as a, daemon(pg_url, settings) as b:
            job = await a.start("s1", "terminal", {}, waiting(release))
            with pytest.raises(TaskRejectedError, match="tasks_max_global"):
                await b.start("s2", "terminal", {}, waiting(release))
            # a's heartbeat runs out (it hangs, or died): its slot no longer counts.
            sql(pg_url, "UPDATE daemons SET expires_at = 0 WHERE pid > 0 AND owner IN"
                        " (SELECT owner FROM slots)")  # fmt: skip
            other = await b.start("s2", "terminal", {}, waiting(release))
            release.set()
            await job.done.wait()
            await other.done.wait()


async def test_the_connection_limit_of_a_user_holds_across_daemons(
    tmp_path: Path, pg_url: str
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with (
            open_fake_llm([]) as llm,
            pg_daemons(
                tmp_path, pg_url, llm.url, 2, NAVI_WS_CONNECTIONS_PER_USER="2", forked=True
            ) as (a, b),
        ):
            token = read_local_token(a.data_dir)
            hello = f'{{"type": "hello", "token": "{token}"}}'
            async with open_websocket_url(a.url) as one, open_websocket_url(b.url) as two:
                for ws in (one, two):
                    await ws.send_message(hello)
                    assert '"welcome"' in await ws.get_message()
                async with open_websocket_url(a.url) as three:  # one on each: a third fails
                    await three.send_message(hello)
                    refused = await three.get_message()
                    assert '"limit"' in refused and "daemons of this database" in refused
                # One closed: there is room again once its daemon gave the slot back (in
                # another process: a trigger on the slots table says when).
                with psycopg.connect(pg_url, autocommit=True) as watch:
                    watch.execute(SLOT_FREED)
                    watch.execute("LISTEN slot_freed")
                    await two.aclose()
                    freed = await trio.to_thread.run_sync(
                        lambda: list(watch.notifies(timeout=TIMEOUT, stop_after=1))
                    )
                assert freed, "the closed connection's slot was never given back"
                assert sql(pg_url, "SELECT count(*) FROM slots WHERE kind = 'conn'") == [(1,)]
                async with open_websocket_url(b.url) as four:
                    await four.send_message(hello)
                    assert '"welcome"' in await four.get_message()
