"""Two runtimes joined as daemons on one PostgreSQL, in one process: a session's frames
from the daemon that runs it reach a client on the other daemon while that one is busy
handing a message of its own over (its run's claim found the session run elsewhere).

The order is forced, not waited for: the hand-over's store write waits until the owner's
stream_end has been heard here. Real PostgreSQL (its LISTEN / NOTIFY carries the frames),
the fake LLM over real HTTP on 127.0.0.1. No sleeps; the test under `trio.fail_after`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from pg_server import pg_url_with_schema as pg_url_with_schema
from test_broadcast_relay import drained
from trio_websocket import open_websocket_url

from navi_trio.api.auth import new_token
from navi_trio.api.server import ApiServer
from navi_trio.core.session import Frame
from navi_trio.core.turn import UserMessage
from navi_trio.runtime import Runtime, open_runtime
from navi_trio.settings import Settings
from navi_trio.testing import open_fake_llm
from navi_trio.testing.harness import test_config as make_config

pytestmark = pytest.mark.slow  # its PostgreSQL server is a process

TIMEOUT = 60
NO_PLAN = {"general": {"planning_first_message": False}}


@asynccontextmanager
async def daemon(
    folder: Path, pg_url: str, replies: list[dict[str, Any]]
) -> AsyncIterator[Runtime]:
    """A runtime joined to the other daemons of the database, as `navi serve` is."""
    async with open_fake_llm(replies) as llm:
        settings = Settings.from_env(
            {},
            db_url=pg_url,
            data_dir=folder / "data",
            llm_backend="ollama",
            llm_url=llm.url,
        )
        async with open_runtime(settings, config=make_config(NO_PLAN), cluster=True) as rt:
            yield rt


async def test_the_owners_end_reaches_a_daemon_whose_run_hands_its_message_over_meanwhile(
    tmp_path: Path, pg_url: str
) -> None:
    """B runs the session; a message sent on A finds it so at its claim, and A stores it and
    hands it to B, busy meanwhile. B's turn ends just then: A's client gets that end, and
    then B's run of A's message, whole."""
    replies: list[dict[str, Any]] = [{"text": "one", "stall": True}, {"text": "two answered"}]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "a", pg_url, []) as a:
            assert a.cluster is not None
            actor = await a.sessions.get("s1")
            await a.cluster.follow("s1")  # before B starts: B reads it with the follows
            sub = actor.subscribe()
            async with daemon(tmp_path / "b", pg_url, replies) as b:
                await b.store.create_session("s1", profile_id="general")
                on_b = (await b.sessions.get("s1")).subscribe()
                heard: list[Frame] = []  # every frame of B's that reached A
                end_heard, both_heard, handing = trio.Event(), trio.Event(), trio.Event()
                relay = actor.relay

                def hearing(frame: Frame) -> None:
                    heard.append(frame)
                    relay(frame)
                    ends = [f for f in heard if f.get("type") == "stream_end"]
                    if ends:
                        end_heard.set()
                    if len(ends) == 2:
                        both_heard.set()

                actor.relay = hearing  # type: ignore[method-assign]
                release = a.store.release_queued

                async def after_the_end(*args: Any, **kwargs: Any) -> int:
                    handing.set()
                    await end_heard.wait()  # B's end arrives while A hands over
                    return await release(*args, **kwargs)

                a.store.release_queued = after_the_end  # type: ignore[method-assign]
                b_actor = await b.sessions.get("s1")
                b_actor.send_message(UserMessage("one"))
                async for frame in on_b.frames:
                    if frame["type"] == "text_delta":
                        break  # B holds the lease
                msg = UserMessage("two")
                actor.send_message(msg)
                await handing.wait()
                assert actor.busy
                b_actor.stop()
                await actor.idle.wait()
                assert msg.accepted.queued
                await both_heard.wait()  # B's run of A's message ended too
                got = drained(sub)
    ends = [f["reason"] for f in got if f["type"] == "stream_end"]
    assert ends == ["stopped", "complete"], [(f["type"], f.get("reason")) for f in got]
    texts = [f["text"] for f in got if f["type"] == "text_delta"]
    assert "".join(texts).endswith("two answered"), texts


async def test_a_stop_sent_while_this_daemon_hands_its_message_over_stops_the_owners_turn(
    tmp_path: Path, pg_url: str
) -> None:
    """B runs the session; a message sent on A is handed to B. A stop a client sends to A
    meanwhile is for the session's running turn, which is B's: it is asked there and B's
    turn stops (before, A's run said "stopped" and B's turn went on). The handed message
    then runs on B, as a queued message does after a stop."""
    replies: list[dict[str, Any]] = [{"text": "one", "stall": True}, {"text": "two answered"}]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "a", pg_url, []) as a, trio.open_nursery() as nursery:
            assert a.cluster is not None
            token = new_token()
            alice = await a.store.create_user("alice", token)
            server = ApiServer(a, host="127.0.0.1", port=0)
            port = await nursery.start(server.run)
            async with daemon(tmp_path / "b", pg_url, replies) as b:
                await b.store.create_session("s1", profile_id="general", user_id=alice["id"])
                b_actor = await b.sessions.get("s1")
                on_b = b_actor.subscribe()
                b_actor.send_message(UserMessage("one", user_id=alice["id"]))
                async for frame in on_b.frames:
                    if frame["type"] == "text_delta":
                        break  # B holds the lease
                handing, stop_answered = trio.Event(), trio.Event()
                release = a.store.release_queued

                async def after_the_stop(*args: Any, **kwargs: Any) -> int:
                    handing.set()
                    await stop_answered.wait()  # the stop arrives while A hands over
                    return await release(*args, **kwargs)

                a.store.release_queued = after_the_stop  # type: ignore[method-assign]
                actor = await a.sessions.get("s1")
                msg = UserMessage("two", user_id=alice["id"])
                actor.send_message(msg)
                await handing.wait()
                assert actor.busy and actor.handing_over
                async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
                    c = Client(ws)
                    await c.send({"type": "hello", "token": token})
                    assert (await c.next())["type"] == "welcome"
                    answer = await c.request({"type": "stop", "session_id": "s1"})
                stop_answered.set()
                assert answer["stopped"] is True, answer
                ends = []
                with trio.move_on_after(20):  # (only a failure waits: B's stalled turn)
                    async for frame in on_b.frames:
                        if frame["type"] == "stream_end":
                            ends.append(frame["reason"])
                            if len(ends) == 2:
                                break
                await actor.idle.wait()
                assert msg.accepted.queued
            nursery.cancel_scope.cancel()
    assert ends == ["stopped", "complete"], ends
