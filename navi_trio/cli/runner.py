"""One turn, followed to its end: in the daemon or in a runtime of this process.

`navi run` (cli/run.py) and `navi mcp serve` (cli/mcp_server.py) both send one user
message and follow its run: the session frames go to a `FrameSink` until the run's
top-level ``stream_end``, approval requests to an `Approver`, and a stop asked for
stops the run cleanly. Two ways to reach the session's actor, with the same frames:

- **the daemon** (`RemoteRun`, `follow_remote`), through `open_daemon`: ``message``,
  its ``ok``, then the session's frames of our run (`OurRun` skips the runs queued
  ahead of ours). The daemon owns the run and its background jobs;
- **a runtime of this process** (`follow_in_runtime`): ``rt.sessions.get(id)``,
  subscribe, ``send_message``, holding the session's lease meanwhile.

`RunTarget` says which: the daemon asked for, else the local one when it answers and a
token is at hand, else this process. Nothing here prints; trio_websocket, the store and
the core are imported on use, so an embedded `navi run` starts light.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from navi_trio import wire
from navi_trio.api.remote import DEFAULT_URL, daemon_answers
from navi_trio.errors import DaemonUnreachableError, NotFoundError
from navi_trio.wire import Frame

if TYPE_CHECKING:
    from navi_trio.api.daemon_client import OurRun
    from navi_trio.core.session_actor import SessionActor
    from navi_trio.runtime import Runtime

# What `navi run` says when its message met a busy session with these strategies.
_BUSY_SAID = {
    "steer": "message steered into the running turn",
    "interrupt": "the running turn is stopped; this message runs next",
}
# Who sends an in-process run's message, and so answers its approvals: the person at
# this shell (role admin); the sessions such a run creates are theirs too.
EMBEDDED_USER = "local"
PROBE_TIMEOUT = 1.0  # is the local daemon there? (a refused connection answers at once)
CONNECT_TIMEOUT = 5.0
MAX_FRAME = 64 * 1024 * 1024


def new_session_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


@attrs.frozen
class RunRequest:
    """One turn, checked: what to send and how to show it."""

    session_id: str
    text: str
    cwd: Path
    profile: str | None
    as_json: bool
    mode: str | None = None
    # What the message does when the session is busy (core/steering.py); None: the
    # profile's default (enqueue unless the profile says otherwise).
    on_busy: str | None = None
    # --cwd given: always sent. Else the shell's folder is sent for an admin only: an
    # ordinary user's cwd must lie inside their workspace_roots (docs/pages/tools.md, "Safety").
    cwd_given: bool = True


class FrameSink(Protocol):
    """Where a followed run's session frames go (`navi run` prints them; the MCP server
    turns them into progress and an answer)."""

    def show(self, frame: Frame) -> bool:
        """Take one session frame; True at this run's top-level stream_end."""
        ...


# (approve, scope) for an approval_request frame.
Approver = Callable[[Frame], Awaitable[tuple[bool, str]]]


@attrs.frozen
class RunTarget:
    """Where runs go: the daemon asked for (`url`), else the local one when it answers
    and a token is at hand, else this process (`daemon()` is None)."""

    url: str | None  # --url: that daemon, none answering is an error
    token: str | None  # --token
    data_dir: Path
    embedded: bool  # an option configures a runtime in this process

    async def daemon(self) -> tuple[str, str] | None:
        """(url, token) of the daemon to run in, or None for an embedded runtime."""
        from navi_trio.api.auth import read_local_token, resolve_token

        if self.url is not None:
            return self.url, resolve_token(self.token, self.data_dir, dict(os.environ))
        if self.embedded:
            return None
        token = self.token or os.environ.get("NAVI_TOKEN") or read_local_token(self.data_dir)
        if not token:
            return None  # no local daemon ever wrote its token here: do not even look
        if not await daemon_answers(DEFAULT_URL, PROBE_TIMEOUT):
            return None
        return DEFAULT_URL, token


# ------------------------------------------------------------------ in this process


async def _follow(
    actor: SessionActor,
    req: RunRequest,
    sink: FrameSink,
    on_sent: Callable[[], object],
    on_approval: Callable[[Frame], None],
) -> None:
    """Send the message to the actor and show its frames until this run ends.

    `on_sent` runs right after the message went in: from then on `actor.stop` stops it.
    It follows the session as the daemon's subscription pumps do (`Follower`): cut off
    for lagging, it subscribes again from the last frame it showed.
    """
    from navi_trio.core.agent import UserMessage
    from navi_trio.core.broadcast import Follower, Lagged

    with Follower(actor.subscribe, lambda: actor.epoch) as follower:
        # The person at this shell owns the machine: the local admin.
        actor.send_message(
            UserMessage(
                req.text, cwd=req.cwd, profile_id=req.profile, user_id=EMBEDDED_USER,
                user_role="admin", mode=req.mode, on_busy=req.on_busy,
            )
        )  # fmt: skip
        on_sent()
        async for frame in follower:
            if isinstance(frame, Lagged):
                continue  # subscribed again: the frames it missed follow
            if frame.get("type") == "approval_request":
                on_approval(frame)
            if sink.show(frame):
                return
    # The actor closed the subscription: the runtime is shutting down.


async def follow_in_runtime(
    rt: Runtime,
    req: RunRequest,
    sink: FrameSink,
    decide: Approver,
    on_sent: Callable[[Callable[[], object]], object] = lambda stop: None,
    after: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run `req` in a session actor of the runtime `rt`, showing its frames on `sink`.

    The lease before anything reads the session: another process may run it. The
    actor's run takes it too (holds nest); this one also covers `after` (navi run's
    wait for the background jobs, which belong to its process). `on_sent(stop)` gets
    the actor's stop once the message went in; `decide` answers approval requests.
    """

    async def answer(frame: Frame) -> None:
        approve, scope = await decide(frame)
        with contextlib.suppress(NotFoundError):  # timed out or stopped meanwhile
            await rt.approvals.answer(
                req.session_id, str(frame["call_id"]), approve=approve, scope=scope,
                user_id=EMBEDDED_USER,
            )  # fmt: skip

    async with trio.open_nursery() as nursery:
        async with rt.agent.leases.hold(req.session_id):
            actor = await rt.sessions.get(req.session_id)
            await _follow(
                actor, req, sink, lambda: on_sent(actor.stop),
                lambda f: nursery.start_soon(answer, f),
            )  # fmt: skip
            if after is not None:
                await after()
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ through the daemon


@attrs.define(eq=False)
class RemoteRun:
    """One message of ours followed through the daemon (`follow_remote`)."""

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


async def follow_remote(
    url: str,
    token: str,
    run: RemoteRun,
    decide: Approver,
    on_accepted: Callable[[], object] = lambda: None,
) -> None:
    """Send `run.req` to the daemon at `url` and follow it until its stream_end;
    `on_accepted` runs once the daemon took the message (its session exists then).

    `run.stop()` sends a ``stop`` (once the run is ours, not one ahead of it; while our
    message is queued it gives up and leaves the message queued). Failures to reach the
    daemon are `DaemonUnreachableError`, refusals `RemoteError`.
    """
    from navi_trio.api.daemon_client import OurRun, open_daemon, remote_error

    req = run.req
    sid = req.session_id
    async with open_daemon(
        url, token, connect_timeout=CONNECT_TIMEOUT, max_frame=MAX_FRAME
    ) as daemon, trio.open_nursery() as nursery:  # fmt: skip

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
        accepted = await daemon.send_message(
            req.text, session_id=sid, profile=req.profile, cwd=cwd, mode=req.mode,
            on_busy=req.on_busy,
        )  # fmt: skip
        on_accepted()
        queued = "navi: the session is busy: message queued (#{})"
        ours = run.ours = OurRun.of(accepted, req.text, lambda n: run.say(queued.format(n)))
        if accepted.on_busy in ("steer", "interrupt"):
            run.say(f"navi: the session is busy: {_BUSY_SAID[accepted.on_busy]}")
        run.accepted.set()
        try:
            while not run.finished:
                frame = await daemon.receive()
                if frame["type"] == wire.ERROR and not isinstance(frame.get("seq"), int):
                    raise remote_error(frame)  # a refused request (an approval's answer)
                if ours.ours(frame):
                    if frame["type"] == "approval_request":
                        nursery.start_soon(answer, frame)
                    run.finished = run.sink.show(frame) or ours.dropped
        except DaemonUnreachableError as exc:
            raise DaemonUnreachableError(
                f"the daemon at {url} closed the connection before the run ended: "
                f"`navi sessions history {sid}` shows what it saved",
                reason=exc.reason,
            ) from None
        nursery.cancel_scope.cancel()
