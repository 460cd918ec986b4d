"""`navi run "message"`: one turn, always through the session's actor.

    navi run [--url URL] [--token T] [--session ID] [--profile P] [--cwd DIR] [--events]

Two ways to reach the actor, with the same output (the plain answer, or with
``--events`` the session's frames as JSON lines) and the same exit codes:

- **the daemon** when one answers: over the WebSocket protocol (``hello``, ``message``,
  then the session's frames until this run's ``stream_end``). The daemon owns the run
  and its background jobs: they go on after `navi run` exits, and their notes reach the
  session's next turn. `--url` asks for a daemon (none answering is an error); without
  it the local one (`DEFAULT_URL`) is tried when a token is at hand (`--token`,
  ``NAVI_TOKEN`` or the token file a local `navi serve` writes);
- else **an embedded runtime** in this process: ``rt.sessions.get(id)``, subscribe,
  ``send_message``. It holds the session's lease while it runs and waits for the
  turn's background jobs before it exits (this process is their only owner).

`--db`, `--config`, `--llm-url` and `--backend` configure an embedded runtime (a daemon
has its own), so giving one of them means "in this process".

The first Ctrl-C, SIGTERM or SIGHUP stops the run cleanly (in the daemon: a ``stop``
frame, then the run's ``stream_end`` is awaited); a second one quits at once.

A tool call that needs approval (README "Safety") is asked on the terminal when there is
one (y: once, s: for this session, a: always, anything else: no); without a terminal it
is denied at once, with a line saying so. In this process the person at the shell is
the local admin; through the daemon the token's role applies. `--mode` asks for a mode
within what that role allows.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

import attrs
import trio

from navi_trio.api.protocol import Frame, encode
from navi_trio.api.remote import (
    DEFAULT_URL,
    DaemonUnreachableError,
    RemoteError,
    daemon_answers,
    receive_frame,
)
from navi_trio.cli_common import (
    DEBUG_HINT,
    EXIT_ERROR,
    EXIT_OK,
    InThread,
    UsageError,
    config_source,
    llm_settings,
    load_settings,
    one_line,
)
from navi_trio.errors import ConfigError, NotFoundError, StoreError
from navi_trio.events import (
    AgentEvent,
    ErrorEvent,
    StreamEnd,
    TextDelta,
    WarningEvent,
    event_from_dict,
)
from navi_trio.llm.factory import make_backend, make_client
from navi_trio.profiles import ConfigSource
from navi_trio.settings import Settings
from navi_trio.tools.sandbox import sandbox_available

if TYPE_CHECKING:
    from navi_trio.core.session_actor import SessionActor
    from navi_trio.core.task_supervisor import Job, TaskSupervisor
    from navi_trio.runtime import Runtime

PROBE_TIMEOUT = 1.0  # is the local daemon there? (a refused connection answers at once)
CONNECT_TIMEOUT = 5.0
MAX_FRAME = 64 * 1024 * 1024
# Options that configure an embedded runtime: a daemon has its own.
_EMBEDDED_OPTIONS = ("db", "config", "llm_url", "backend", "local", "model_file")
_RUN_ID = "run"


def new_session_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


@attrs.define
class RunOutcome:
    end: StreamEnd | None = None
    error: str | None = None  # the last top-level error message, already printed
    signal: int | None = None  # the first stop signal (SIGINT, SIGTERM, SIGHUP)
    printed_text: bool = False


# Stop signals are handled alike: the first stops the run cleanly (partial answer saved,
# tool processes killed), a second one quits without waiting for that.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_for(signum: int) -> int:
    """The shell's convention: 128 + the signal number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + signum


def _say(err: TextIO, text: str) -> None:
    try:
        print(text, file=err, flush=True)
    except (OSError, ValueError):
        pass  # the terminal is gone (SIGHUP): stopping cleanly matters more than saying so


def _message_text(args: argparse.Namespace) -> str:
    text = sys.stdin.read() if args.message == "-" else args.message
    if not text.strip():
        raise UsageError("the message is empty")
    return str(text)


def _output_gone(*streams: TextIO) -> tuple[TextIO, TextIO]:
    """After a hang-up the terminal is gone: send the rest of the output nowhere.

    The descriptors are pointed at /dev/null too, so flushing what is still buffered
    (now or at exit) cannot fail a run that is stopping cleanly.
    """
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in streams:
            try:
                os.dup2(null, stream.fileno())
            except (OSError, ValueError, io.UnsupportedOperation):
                pass  # not a real file (a test's StringIO): nothing to redirect
    finally:
        os.close(null)
    sink = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives until exit
    return sink, sink


@attrs.define(eq=False)
class _StopHandler:
    """What the first stop signal does right now: stop the run, later cancel the jobs."""

    outcome: RunOutcome
    outer: trio.CancelScope
    err: TextIO
    action: Callable[[], object] = lambda: None
    what: str = "the run"

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if self.outcome.signal is not None:
                self.outer.cancel()  # the second signal: stop waiting for the clean stop
                return
            self.outcome.signal = signum
            self.action()
            if signum == signal.SIGINT:
                name, again = "Ctrl-C", "Ctrl-C again to quit now"
            else:
                name, again = signal.Signals(signum).name, "a second signal quits at once"
            _say(self.err, f"navi: {name}: stopping {self.what} ({again})")

    def switch(self, action: Callable[[], object], what: str) -> None:
        self.action, self.what = action, what
        if self.outcome.signal is not None:
            action()  # a signal already came: do not start waiting at all


@attrs.define(eq=False)
class _Printer:
    """Shows the session's frames: the answer on stdout, warnings and errors on stderr."""

    as_json: bool
    outcome: RunOutcome
    out: TextIO
    err: TextIO

    def show(self, frame: Frame) -> bool:
        """Print one session frame; True at this run's top-level stream_end."""
        if frame.get("type") == "resync":  # cut off and the replay was gone
            _say(self.err, "navi: warning: some output was skipped (navi fell behind); "
                 "the session's history has all of it")  # fmt: skip
            return False
        # As `navi run` always printed them: the epoch only matters to a client that
        # subscribes again, which navi run never does.
        frame = {k: v for k, v in frame.items() if k != "epoch"}
        event = event_from_dict(frame)
        try:
            self._show(frame, event)
        except OSError:
            if self.outcome.signal is None:
                raise
            self.out, self.err = _output_gone(self.out, self.err)
        return isinstance(event, StreamEnd) and not event.is_subagent

    def _show(self, frame: Frame, event: AgentEvent) -> None:
        outcome, out, err = self.outcome, self.out, self.err
        top = not event.is_subagent
        if isinstance(event, StreamEnd) and top:
            outcome.end = event
        if self.as_json:
            print(json.dumps(frame), file=out, flush=True)
            if isinstance(event, ErrorEvent) and top:
                outcome.error = one_line(event.message)  # stdout only: cmd_run repeats it
            return
        who = "" if top else f"[{event.agent_id or 'sub-agent'}] "
        message = one_line(getattr(event, "message", ""))
        if isinstance(event, TextDelta) and top:
            out.write(event.text)
            out.flush()
            outcome.printed_text = outcome.printed_text or bool(event.text)
        elif isinstance(event, StreamEnd) and top:
            if not outcome.printed_text and event.text:
                out.write(event.text)
                outcome.printed_text = True
            if outcome.printed_text:
                out.write("\n")
                out.flush()
        elif isinstance(event, WarningEvent):
            print(f"navi: warning: {who}{message}", file=err, flush=True)
        elif isinstance(event, ErrorEvent):
            hint = f" {DEBUG_HINT}" if event.code == "internal" else ""
            print(f"navi: error: {who}{message}{hint}", file=err, flush=True)
            if top:
                outcome.error = message


@attrs.frozen
class RunRequest:
    """One `navi run`, checked: what to send and how to show it."""

    session_id: str
    text: str
    cwd: Path
    profile: str | None
    as_json: bool
    mode: str | None = None
    # --cwd given: always sent. Else the shell's folder is sent for an admin only: an
    # ordinary user's cwd must lie inside their workspace_roots (README "Safety").
    cwd_given: bool = True


class FrameSink(Protocol):
    """Where a followed run's session frames go (`navi run` prints them; mcp_serve.py
    turns them into progress and an answer)."""

    def show(self, frame: Frame) -> bool:
        """Take one session frame; True at this run's top-level stream_end."""
        ...


# (approve, scope) for an approval_request frame.
Approver = Callable[[Frame], Awaitable[tuple[bool, str]]]


def _ask_line(prompt: str) -> str:
    """Blocking: one answer typed on the terminal (run in a worker thread)."""
    print(prompt, end="", file=sys.stderr, flush=True)
    return sys.stdin.readline()


async def decide_approval(frame: Frame, err: TextIO, *, interactive: bool) -> tuple[bool, str]:
    """(approve, scope) for an `approval_request` frame: asked on the terminal, or no."""
    tool, summary = frame.get("tool", "?"), one_line(str(frame.get("summary", "")))
    rule = frame.get("rule", "")
    if not interactive:
        _say(err, f"navi: denied {tool} ({summary}): it needs approval ({rule}) and there is "
             "no terminal to ask; run it with a terminal, or allow it with a rule")  # fmt: skip
        return False, "once"
    line = await trio.to_thread.run_sync(
        _ask_line,
        f"navi: approve {tool}: {summary}  [{rule}]? [y]es / [s]ession / [a]lways / [N]o: ",
        abandon_on_cancel=True,
    )
    choice = line.strip().lower()[:1]
    scope = {"y": "once", "s": "session", "a": "always"}.get(choice)
    return (scope is not None), (scope or "once")


def _interactive() -> bool:
    try:
        return sys.stdin.isatty()
    except (ValueError, OSError):
        return False


# ------------------------------------------------------------------ embedded runtime


async def _wait_for_background(
    supervisor: TaskSupervisor, session_id: str, stopper: _StopHandler, err: TextIO
) -> None:
    """In-process, `navi run` is the only owner of its background jobs: wait.

    Their results become task notes in the store, read by the session's next turn.
    A stop signal cancels them (each still leaves a "cancelled" note).
    """

    def running() -> list[Job]:
        return [job for job in supervisor.list_jobs(session_id) if not job.finished]

    def cancel_all() -> None:
        for job in running():
            supervisor.cancel(session_id, job.task_id)

    jobs = running()
    if not jobs:
        return
    _say(err, f"navi: waiting for {len(jobs)} background task(s)… Ctrl-C to cancel them")
    stopper.switch(cancel_all, "the background task(s)")
    while jobs:  # a background sub-agent may start further jobs while we wait
        for job in jobs:
            await job.done.wait()
        jobs = running()


async def _follow(
    actor: SessionActor,
    req: RunRequest,
    sink: FrameSink,
    on_sent: Callable[[], object],
    on_approval: Callable[[Frame], None],
) -> None:
    """Send the message to the actor and show its frames until this run ends.

    `on_sent` runs right after the message went in: from then on `actor.stop` stops it.
    """
    from navi_trio.core.agent import UserMessage

    last: int | None = None
    sent = False
    while True:
        # Live frames first; after being cut off for lagging, from the last one shown.
        with actor.subscribe(last, actor.epoch if last is not None else None) as sub:
            if not sent:
                # The person at this shell owns the machine: the local admin.
                actor.send_message(
                    UserMessage(
                        req.text, cwd=req.cwd, profile_id=req.profile, user_role="admin",
                        mode=req.mode,
                    )
                )  # fmt: skip
                sent = True
                on_sent()
            async for frame in sub.frames:
                if isinstance(frame.get("seq"), int):
                    last = frame["seq"]
                if frame.get("type") == "approval_request":
                    on_approval(frame)
                if sink.show(frame):
                    return
        if sub.lagged is None:
            return  # the actor closed the subscription: the runtime is shutting down


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
                req.session_id, str(frame["call_id"]), approve=approve, scope=scope
            )

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


async def run_embedded(
    settings: Settings, source: ConfigSource, req: RunRequest, out: TextIO, err: TextIO
) -> RunOutcome:
    # The LLM's HTTP client is built and the sandbox probed (open_runtime's probe then
    # finds the answer cached) in threads while this one imports the runtime (imported
    # here so `navi --help` and `navi doctor` stay light).
    local = settings.llm_backend.strip().lower() == "local"
    building = None if local else InThread(make_client, settings)
    probing = InThread(sandbox_available, settings.bwrap_path)
    from navi_trio.runtime import open_runtime

    await probing.result()  # first: it never raises, so both threads are joined
    client = None if building is None else await building.result()
    backend = None if client is None else make_backend(settings, client)
    outcome = RunOutcome()
    printer = _Printer(req.as_json, outcome, out, err)
    with trio.CancelScope() as outer, trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        stopper = _StopHandler(outcome, outer, err)
        async with (
            client if client is not None else contextlib.nullcontext(),
            open_runtime(settings, config=source, backend=backend) as rt,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(stopper.watch, signals)
            print(f"session: {req.session_id}", file=err, flush=True)

            async def wait_for_jobs() -> None:
                await _wait_for_background(rt.supervisor, req.session_id, stopper, printer.err)

            await follow_in_runtime(
                rt, req, printer, lambda f: decide_approval(f, err, interactive=_interactive()),
                on_sent=lambda stop: stopper.switch(stop, "the run"), after=wait_for_jobs,
            )  # fmt: skip
            nursery.cancel_scope.cancel()
    if outer.cancelled_caught and outcome.signal is None:
        outcome.signal = signal.SIGINT
    return outcome


# ------------------------------------------------------------------ through the daemon


@attrs.define(eq=False)
class RemoteRun:
    """Follows one message of ours through the daemon's frames of the session."""

    req: RunRequest
    sink: FrameSink
    err: TextIO  # where the notes on a queued message go
    stop_wanted: trio.Event = attrs.field(factory=trio.Event)
    # Set once the first frame after our message says whether it runs or waits.
    known: trio.Event = attrs.field(factory=trio.Event)
    started: bool = False  # our run's frames are coming (not a run ahead of ours)
    on_approval: Callable[[Frame], None] = lambda frame: None
    ahead: int | None = None  # runs to wait for when our message was queued
    finished: bool = False
    abandoned: bool = False  # stopped while queued: the message stays in the daemon

    def stop(self) -> None:
        self.stop_wanted.set()

    def frame(self, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "error" and "seq" not in frame:  # a refused request, not an event
            raise RemoteError(str(frame.get("code", "?")), str(frame.get("message", frame)))
        if frame.get("session_id") != self.req.session_id or "seq" not in frame:
            return  # replies, task_update (out-of-band), lagged (the daemon resubscribes)
        if frame["seq"] is None:
            return
        if not self.started:
            if self.ahead is None and kind == "message_queued":
                # The first frame after our message: it waits behind `position` runs.
                self.ahead = int(frame.get("position", 1))
                self.known.set()
                _say(self.err, f"navi: the session is busy: message queued (#{self.ahead})")
                return
            if self.ahead:
                if kind == "stream_end" and not frame.get("is_subagent"):
                    self.ahead -= 1
                return
            self.started = True
            self.known.set()
        if kind == "approval_request":
            self.on_approval(frame)
        self.finished = self.sink.show(frame)


async def follow_remote(
    url: str,
    token: str,
    run: RemoteRun,
    decide: Approver,
    on_welcome: Callable[[], object] = lambda: None,
) -> None:
    """Send `run.req` to the daemon at `url` and follow it until its stream_end.

    `run.stop()` sends a ``stop`` (once the run is ours, not one ahead of it; while our
    message is queued it gives up and leaves the message queued). Failures to reach the
    daemon are `DaemonUnreachableError`, refusals `RemoteError`.
    """
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    req, err = run.req, run.err
    try:
        async with open_websocket_url(
            url, connect_timeout=CONNECT_TIMEOUT, max_message_size=MAX_FRAME
        ) as ws, trio.open_nursery() as nursery:  # fmt: skip
            await ws.send_message(encode({"type": "hello", "token": token}))
            welcome = await receive_frame(ws)
            if welcome.get("type") != "welcome":
                run.frame(welcome)  # the error frame: raises
            on_welcome()

            async def send_stop() -> None:
                await run.stop_wanted.wait()
                await run.known.wait()  # a stop must not hit the run ahead of ours
                if not run.started:  # queued behind another run: not ours to stop
                    _say(err, "navi: the message stays queued in the daemon")
                    run.abandoned = True
                    nursery.cancel_scope.cancel()
                    return
                await ws.send_message(encode({"type": "stop", "session_id": req.session_id}))

            message: Frame = {"type": "message", "id": _RUN_ID, "content": req.text,
                              "session_id": req.session_id}  # fmt: skip
            role = (welcome.get("user") or {}).get("role")
            if req.cwd_given or role == "admin":
                message["cwd"] = str(req.cwd)
            if req.profile is not None:
                message["profile"] = req.profile
            if req.mode is not None:
                message["mode"] = req.mode

            async def answer(frame: Frame) -> None:
                approve, scope = await decide(frame)
                await ws.send_message(encode({
                    "type": "approve" if approve else "deny", "session_id": req.session_id,
                    "call_id": frame["call_id"], "scope": scope,
                }))  # fmt: skip

            run.on_approval = lambda f: nursery.start_soon(answer, f)
            await ws.send_message(encode(message))
            nursery.start_soon(send_stop)
            while not run.finished:
                run.frame(await receive_frame(ws))
            nursery.cancel_scope.cancel()
    except (OSError, HandshakeError) as exc:
        detail = one_line(str(exc))
        raise DaemonUnreachableError(
            f"no daemon answers at {url}: start one with `navi serve`"
            + (f" ({detail})" if detail else "")
        ) from None
    except ConnectionClosed:
        raise DaemonUnreachableError(
            f"the daemon at {url} closed the connection before the run ended: "
            f"`navi sessions history {req.session_id}` shows what it saved"
        ) from None


async def run_remote(url: str, token: str, req: RunRequest, out: TextIO, err: TextIO) -> RunOutcome:
    outcome = RunOutcome()
    printer = _Printer(req.as_json, outcome, out, err)
    run = RemoteRun(req, printer, err)
    with trio.CancelScope() as outer, trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        stopper = _StopHandler(outcome, outer, err, run.stop)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stopper.watch, signals)
            await follow_remote(
                url, token, run, lambda f: decide_approval(f, err, interactive=_interactive()),
                on_welcome=lambda: print(f"session: {req.session_id}", file=err, flush=True),
            )  # fmt: skip
            nursery.cancel_scope.cancel()
    if (outer.cancelled_caught or run.abandoned) and outcome.signal is None:
        outcome.signal = signal.SIGINT
    return outcome


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


def run_target(args: argparse.Namespace, settings: Settings) -> RunTarget:
    """The `RunTarget` of the options; --url with an embedded-runtime option is refused."""
    explicit = args.url is not None
    embedded = [o for o in _EMBEDDED_OPTIONS if getattr(args, o, None) not in (None, False)]
    if explicit and embedded:
        names = ", ".join("--" + o.replace("_", "-") for o in embedded)
        raise UsageError(
            f"--url runs the turn in the daemon, which has its own settings: drop {names} or --url"
        )
    return RunTarget(args.url, args.token, settings.data_dir, bool(embedded))


def daemon_target(args: argparse.Namespace, settings: Settings) -> tuple[str, str] | None:
    """(url, token) of the daemon to run in, or None for an embedded runtime."""
    return trio.run(run_target(args, settings).daemon)


# ------------------------------------------------------------------ the command


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.session is not None:
        from navi_trio.store.sqlite import check_session_id  # the store: imported on use

        try:
            check_session_id(args.session)
        except StoreError as exc:
            raise UsageError(f"--session: {exc}") from None
    settings = load_settings(args)
    text = _message_text(args)
    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    if not cwd.is_dir():  # before any probing
        raise UsageError(f"--cwd {cwd}: not a directory")
    session_id = args.session if args.session is not None else new_session_id()
    req = RunRequest(
        session_id, text, cwd, args.profile, args.events, args.mode, cwd_given=args.cwd is not None
    )
    target = daemon_target(args, settings)
    if target is not None:
        outcome = trio.run(run_remote, *target, req, out, err)
    else:
        # In this process: the LLM is chosen here (--local, or Ollama / the local model
        # when nothing is configured), with the `local` profile for --local.
        settings = llm_settings(args, err)
        source = config_source(settings)
        profiles = source.current.profiles
        if args.profile is not None and args.profile not in profiles:
            raise ConfigError(
                f"unknown profile {args.profile!r} (profiles in {settings.config_path}: "
                f"{', '.join(sorted(profiles))})"
            )
        outcome = trio.run(run_embedded, settings, source, req, out, err)
    return exit_code(outcome, args.events, err)


def exit_code(outcome: RunOutcome, as_json: bool, err: TextIO) -> int:
    end = outcome.end
    if outcome.signal is not None:
        return exit_code_for(outcome.signal)
    if end is None:
        print("navi: error: the run ended without a result", file=err)
        return EXIT_ERROR
    if end.reason == "complete":
        return EXIT_OK
    # In plain mode the error event was already printed as the one line; in --events
    # mode it went to stdout, so say it on stderr too.
    if outcome.error is None or as_json:
        reason = outcome.error or f"the run ended with reason {end.reason}"
        print(f"navi: error: {reason}", file=err)
    return EXIT_ERROR
