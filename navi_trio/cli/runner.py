"""Where a command speaks the protocol, and one turn followed there to its end.

Every `navi` verb speaks the WebSocket protocol through `open_daemon`: to the daemon
asked for (or the local one when it answers and a token is at hand), else to a private
one of this process, on loopback with a token only this process knows. The frames are
the same either way. Nothing here prints; the store and the core are imported on use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from navi_trio import wire
from navi_trio.api.endpoint import Endpoint, connect
from navi_trio.errors import DaemonUnreachableError, RemoteError, UsageError
from navi_trio.wire import Frame
from navi_trio.wire import new_session_id as new_session_id

if TYPE_CHECKING:
    from navi_trio.api.daemon_client import OurRun
    from navi_trio.api.redial import Redialing
    from navi_trio.llm.base import LLMBackend
    from navi_trio.profiles import ConfigSource
    from navi_trio.settings import Settings

# What `navi run` says when its message met a busy session with these strategies.
_BUSY_SAID = {
    "steer": "message steered into the running turn",
    "interrupt": "the running turn is stopped; this message runs next",
}


@attrs.frozen
class RunRequest:
    """One turn, checked: what to send and how to show it."""

    session_id: str
    text: str
    cwd: Path
    profile: str | None
    as_json: bool
    mode: str | None = None
    # What the message does when the session is busy (core/turn/steering.py); None: the
    # profile's default (enqueue unless the profile says otherwise).
    on_busy: str | None = None
    # --cwd given: always sent. Else the shell's folder is sent for an admin only: an
    # ordinary user's cwd must lie inside their workspace_roots (docs/pages/tools.md, "Safety").
    cwd_given: bool = True
    # True: a text "/name words" naming a command kept as a file in `cwd` (or the
    # user's own: navi_trio/project/commands.py) is sent as its expanded prompt.
    commands: bool = False


class FrameSink(Protocol):
    """Where a followed run's session frames go (`navi run` prints them; the MCP server
    turns them into progress and an answer)."""

    def show(self, frame: Frame) -> bool:
        """Take one session frame; True at this run's top-level stream_end."""
        ...


# (approve, scope) for an approval_request frame.
Approver = Callable[[Frame], Awaitable[tuple[bool, str]]]


@asynccontextmanager
async def private_endpoint(
    settings: Settings, config: ConfigSource, *, backend: LLMBackend | None = None
) -> AsyncIterator[Endpoint]:
    """`serve_privately` with these settings, as an `Endpoint` (the server imported on use:
    a command that finds a daemon never loads it)."""
    from navi_trio.cli.serve import serve_privately

    async with serve_privately(settings, config, backend=backend) as where:
        yield Endpoint(where.url, where.token, private=True)


@attrs.define(eq=False)
class RemoteRun:
    """One message of ours followed through a daemon (`follow`)."""

    req: RunRequest
    sink: FrameSink
    say: Callable[[str], object] = lambda line: None  # notes: queued, left queued
    stop_wanted: trio.Event = attrs.field(factory=trio.Event)
    accepted: trio.Event = attrs.field(factory=trio.Event)  # the daemon answered the message
    ours: OurRun | None = None  # set once the daemon took the message
    finished: bool = False
    abandoned: bool = False  # stopped while queued: the message stays in the daemon

    def stop(self) -> None:
        self.stop_wanted.set()


# What a caller does on the open connection before the message goes (a check) or after
# the run ended (navi run: wait for its background jobs in a private daemon).
OnConnection = Callable[["Redialing"], Awaitable[None]]


async def follow(
    endpoint: Endpoint,
    run: RemoteRun,
    decide: Approver,
    on_accepted: Callable[[], object] = lambda: None,
    *,
    before: OnConnection | None = None,
    after: OnConnection | None = None,
) -> None:
    """Send `run.req` and follow it until its stream_end; `on_accepted` runs once the
    daemon took the message. `run.stop()` sends a ``stop`` once the run is ours (while our
    message is queued it leaves it queued). A dropped connection is dialled again and
    the message sent again with its key (`open_redialing`); a daemon lost for good is
    `DaemonUnreachableError`, refusals `RemoteError`.
    """
    from navi_trio.api.daemon_client import OurRun, remote_error
    from navi_trio.api.redial import open_redialing

    req = run.req
    sid = req.session_id
    async with (
        open_redialing(lambda: connect(endpoint), url=endpoint.url) as daemon,
        trio.open_nursery() as nursery,
    ):
        if before is not None:
            await before(daemon)

        async def send_stop() -> None:
            await run.stop_wanted.wait()
            await run.accepted.wait()  # a stop must not hit the run ahead of ours
            if run.ours is None or not run.ours.started:  # queued: not ours to stop
                run.say("navi: the message stays queued in the daemon")
                run.abandoned = True
                nursery.cancel_scope.cancel()
                return
            await daemon.send(wire.stop(sid))

        async def answer(frame: Frame) -> None:
            approve, scope = await decide(frame)
            await daemon.send(wire.approval(approve, sid, str(frame["call_id"]), scope))

        nursery.start_soon(send_stop)
        cwd = str(req.cwd) if req.cwd_given or daemon.role == "admin" else None
        text = req.text
        if req.commands and text.startswith("/"):
            text = await _command_prompt(daemon, text, cwd, run.say)
        try:
            accepted = await daemon.send_message(
                text,
                session_id=sid,
                profile=req.profile,
                cwd=cwd,
                mode=req.mode,
                on_busy=req.on_busy,
            )
            on_accepted()
            queued = "navi: the session is busy: message queued (#{})"
            ours = run.ours = OurRun.of(accepted, text, lambda n: run.say(queued.format(n)))
            if accepted.on_busy in ("steer", "interrupt"):
                run.say(f"navi: the session is busy: {_BUSY_SAID[accepted.on_busy]}")
            run.accepted.set()
            while not run.finished:
                frame = await daemon.receive()
                if frame["type"] == wire.ERROR and not isinstance(frame.get("seq"), int):
                    raise remote_error(frame)  # a refused request (an approval's answer)
                if ours.ours(frame):
                    if frame["type"] == "approval_request":
                        nursery.start_soon(answer, frame)
                    run.finished = run.sink.show(frame) or ours.dropped
                elif frame["type"] == wire.RESYNC and frame.get("session_id") == sid:
                    run.sink.show(frame)  # the frames asked for are gone: said
            if after is not None and not ours.dropped:
                await after(daemon)
        except DaemonUnreachableError as exc:
            history = f"`navi sessions history {sid}`"
            if history in str(exc):
                raise
            raise DaemonUnreachableError(
                f"{exc}; the run was not followed to its end: {history} shows what the "
                "daemon saved",
                reason=exc.reason,
            ) from None
        nursery.cancel_scope.cancel()


async def _command_prompt(
    daemon: Redialing, text: str, cwd: str | None, say: Callable[[str], object]
) -> str:
    """The prompt of the command kept as a file that `text` ("/name words") names, with the
    words in it; `text` itself when there is none."""
    from navi_trio.command_text import CommandTooLongError, expand_command

    name, _, rest = text[1:].partition(" ")
    try:
        listed = await daemon.request(wire.commands(cwd))
    except RemoteError as exc:  # an older daemon, a folder refused: sent as typed
        say(f"navi: no commands kept as files: {exc}; sent as typed")
        return text
    for item in listed.get("commands") or []:
        if isinstance(item, dict) and item.get("name") == name:
            try:
                return expand_command(str(item.get("body", "")), rest)
            except CommandTooLongError as exc:
                raise UsageError(f"/{name}: {exc}") from None
    return text
