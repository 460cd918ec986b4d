"""Drive navi_trio's actors directly — for our tests and for harnesses outside this repo.

    from navi_trio.testing import open_harness

    async with open_harness(tmp_path, replies=[{"text": "Hello there"}]) as h:
        s = await h.session("s-1")
        s.send("hi")
        frames = await s.until_end()        # every frame up to this run's stream_end
        assert frames[-1]["text"] == "Hello there"

A full runtime on a SQLite file under `tmp_path`, talking real HTTP to a
`FakeLLMServer` (or, with `scripted=True`, the in-process `ScriptedBackend`). A
`SessionDriver` subscribes to one session's frames; its reads never poll.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core.session import Frame, LocalBroadcast, ReplayBuffer, SessionActor, Subscription
from navi_trio.core.turn import Observer, UserMessage
from navi_trio.llm.script import Reply
from navi_trio.llm.scripted import ScriptedBackend
from navi_trio.profiles import ConfigSource, parse_config
from navi_trio.runtime import Runtime, open_runtime
from navi_trio.settings import Settings, default_config_path
from navi_trio.testing.fake_llm import FakeLLMServer
from navi_trio.testing.postgres import TEST_STORE_ENV, shared_database
from navi_trio.tools.base import Tool


def replay_buffer(actor: SessionActor) -> ReplayBuffer:
    """The replay buffer of an in-process session's broadcast (for tests)."""
    assert isinstance(actor.broadcast, LocalBroadcast), actor.broadcast
    return actor.broadcast.buffer


class SessionDriver:
    def __init__(self, actor: SessionActor, subscription: Subscription) -> None:
        self.actor = actor
        self.subscription = subscription
        self.frames: list[Frame] = []

    @property
    def session_id(self) -> str:
        return self.actor.session_id

    def send(self, text: str, **kwargs: Any) -> None:
        self.actor.send_message(UserMessage(text, **kwargs))

    def stop(self) -> bool:
        return self.actor.stop()

    def compact(self) -> None:
        self.actor.compact()

    async def next(self) -> Frame:
        frame = await self.subscription.frames.receive()
        self.frames.append(frame)
        return frame

    async def until(self, pred: Callable[[Frame], bool]) -> list[Frame]:
        """Frames up to and including the first one matching `pred`."""
        got: list[Frame] = []
        while True:
            frame = await self.next()
            got.append(frame)
            if pred(frame):
                return got

    async def until_type(self, type_: str, **match: Any) -> list[Frame]:
        return await self.until(
            lambda f: f["type"] == type_ and all(f.get(k) == v for k, v in match.items())
        )

    async def until_end(self) -> list[Frame]:
        """Frames up to the top-level stream_end of the current run."""
        return await self.until(lambda f: f["type"] == "stream_end" and not f["is_subagent"])

    async def idle(self) -> None:
        """Wait until no run is active and the queue is empty."""
        await self.actor.idle.wait()


@attrs.define(eq=False)
class Harness:
    runtime: Runtime
    fake: FakeLLMServer | None
    scripted: ScriptedBackend | None
    tmp_path: Path

    async def session(self, session_id: str) -> SessionDriver:
        actor = await self.runtime.sessions.get(session_id)
        return SessionDriver(actor, actor.subscribe())

    async def turn(self, session_id: str, text: str, **kwargs: Any) -> list[Frame]:
        """Send one message and return its frames up to stream_end."""
        driver = await self.session(session_id)
        try:
            driver.send(text, **kwargs)
            return await driver.until_end()
        finally:
            driver.subscription.close()

    async def user(self, name: str, role: str = "user") -> str:
        """A user added to the store (runs check their sender is one); their id."""
        row = await self.runtime.store.create_user(name, secrets.token_urlsafe(32), role)
        return str(row["id"])

    def add_replies(self, *replies: Reply | dict[str, Any]) -> None:
        target = self.fake or self.scripted
        assert target is not None
        target.add_replies(*replies)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies of the chat requests the LLM got, in order."""
        if self.fake is not None:
            return [r["body"] for r in self.fake.chat_requests]
        assert self.scripted is not None
        return [
            {"messages": r.messages, "tools": r.tools, "think": r.think, "model": r.model}
            for r in self.scripted.requests
        ]


def test_config(
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    base: Path | None = None,
    default_profile: str | None = None,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    persona: str | None = None,
) -> ConfigSource:
    """A ConfigSource on the shipped config, with `profiles` merged over its profiles
    (`{"general": {"think_enabled": False}}` changes one flag; a new id adds a profile);
    `persona`: this text instead of the shipped persona file ("": none).
    """
    path = base or default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    for pid, changes in (profiles or {}).items():
        data["profiles"][pid] = {**data["profiles"].get(pid, {}), **changes}
    if default_profile:
        data["default_profile"] = default_profile
    if persona is not None:
        data.pop("persona_file", None)
        data["persona"] = persona
    if models is not None:
        data["models"] = dict(models)
    return ConfigSource(path, initial=parse_config(data, path))


def virtual_wall() -> Callable[[], float]:
    """A wall clock on trio's clock (called inside `trio.run`): it reads the real time
    now and moves only as trio's clock moves, so on a MockClock the scheduler's due
    times and the store's lease expiry pass with the test's virtual sleeps."""
    start = time.time() - trio.current_time()
    return lambda: start + trio.current_time()


@asynccontextmanager
async def open_harness(
    tmp_path: Path,
    *,
    replies: Iterable[Reply | dict[str, Any]] = (),
    loop: bool = False,
    scripted: bool = False,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    config: ConfigSource | None = None,
    dialect: str = "ollama",
    tools: list[Tool] | None = None,
    schedules: bool = False,
    wall_clock: Callable[[], float] | None = None,
    checkpoint_wall: Callable[[], float] | None = None,
    observer: Observer | None = None,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """A runtime on `tmp_path/navi.db` with the fake LLM (or the scripted backend).

    `tools` replaces the default tool set; `schedules` runs the scheduler, on `wall_clock`
    when given; `checkpoint_wall` is the checkpoints' clock.
    """
    cfg = config or test_config(profiles)
    async with trio.open_nursery() as nursery:
        fake: FakeLLMServer | None = None
        backend: ScriptedBackend | None = None
        if scripted:
            backend = ScriptedBackend(list(replies), loop=loop)
        else:
            fake = FakeLLMServer(list(replies), loop=loop)
            await nursery.start(fake.serve)
        values: dict[str, Any] = {
            "db_path": tmp_path / "navi.db",
            "data_dir": tmp_path / "data",
            "llm_backend": dialect,
            "llm_url": fake.url if fake else "http://127.0.0.1:9",
            **settings,
        }
        on_server = not {"db_path", "db_url"} & settings.keys()  # a test's own db wins
        if on_server and os.environ.get(TEST_STORE_ENV) == "postgres":
            values["db_url"] = await trio.to_thread.run_sync(shared_database, str(tmp_path))
        conf = Settings.from_env({}, **values)
        async with open_runtime(
            conf,
            backend=backend,
            config=cfg,
            tools=tools,
            schedules=schedules,
            wall_clock=wall_clock,
            checkpoint_wall=checkpoint_wall,
            observer=observer,
        ) as rt:
            yield Harness(runtime=rt, fake=fake, scripted=backend, tmp_path=tmp_path)
        nursery.cancel_scope.cancel()
